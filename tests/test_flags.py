"""Triton's boolean flags as `hubserve serve` reads them (engine/flags.py), pure: the parser only."""

from __future__ import annotations

import pytest

from engine.__main__ import build_parser


def _serve(*flags: str):
    return build_parser().parse_args(["serve", "--model-repository", "r", *flags])


@pytest.mark.parametrize("proto", ["grpc", "http"])
@pytest.mark.parametrize(("flags", "expected"), [
    ((), False),
    (("--{p}-use-ssl",), True),
    (("--{p}-use-ssl=true",), True),
    (("--{p}-use-ssl=TRUE",), True),
    (("--{p}-use-ssl=on",), True),
    (("--{p}-use-ssl=1",), True),
    (("--{p}-use-ssl", "true"), True),
    (("--{p}-use-ssl=false",), False),
    (("--{p}-use-ssl=Off",), False),
    (("--{p}-use-ssl", "0"), False),
    (("--{p}-use-ssl", "--{p}-use-ssl=false"), False),  # the last one counts
])
def test_use_ssl_spellings(proto, flags, expected):
    args = _serve(*(f.format(p=proto) for f in flags))
    assert getattr(args, f"{proto}_use_ssl") is expected


def test_mutual_turns_tls_on_as_in_triton_in_command_line_order():
    args = _serve("--grpc-use-ssl-mutual")
    assert args.grpc_use_ssl and args.grpc_use_ssl_mutual
    args = _serve("--grpc-use-ssl-mutual=false")  # Triton: TLS on, no client certificates
    assert args.grpc_use_ssl and not args.grpc_use_ssl_mutual
    args = _serve("--grpc-use-ssl-mutual=true", "--grpc-use-ssl=false")
    assert not args.grpc_use_ssl
    assert not _serve("--grpc-use-ssl-mutual").http_use_ssl


@pytest.mark.parametrize(("flags", "expected"), [
    ((), True),
    (("--strict-readiness",), True),
    (("--strict-readiness=false",), False),
    (("--strict-readiness", "off"), False),
    (("--strict-readiness=1",), True),
    (("--no-strict-readiness",), False),
])
def test_strict_readiness_takes_tritons_spelling_and_ours(flags, expected):
    assert _serve(*flags).strict_readiness is expected


@pytest.mark.parametrize("flag", ["--grpc-use-ssl=yes", "--strict-readiness=2", "--http-use-ssl-mutual=t"])
def test_other_values_are_refused_in_tritons_words(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _serve(flag)
    assert exit_info.value.code == 2
    assert f"invalid value for bool option: {flag.partition('=')[2]}" in capsys.readouterr().err


def test_no_form_takes_no_value(capsys):
    with pytest.raises(SystemExit):
        _serve("--no-strict-readiness=false")
    assert "takes no value" in capsys.readouterr().err
