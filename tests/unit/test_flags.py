"""Triton's boolean flags as `hubserve serve` reads them (engine/cli/flags.py), its help by topic with each
default once, and its port flags; pure: the parser only."""

from __future__ import annotations

import re

import pytest

from engine.cli.parser import build_parser


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


SERVE_GROUPS = ["models and the repository", "network", "processes", "what one request may hold",
                "execution, batching and sequences", "generative models (the OpenAI API's engine)",
                "access and API keys", "client shared memory", "TLS",
                "the OpenAI Batch API (on with --batch-dir)", "logging and tracing", "metrics"]


def _serve_help(capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_serve_help_lists_every_flag_in_a_group_by_topic(capsys):
    text = _serve_help(capsys)
    assert text.splitlines()[0] == "usage: hubserve serve --model-repository DIR [FLAGS]"
    sections = {s.split(":\n", 1)[0]: s for s in re.split(r"\n\n(?=\S)", text)}
    assert [t for t in sections if t in SERVE_GROUPS] == SERVE_GROUPS
    assert re.findall(r"^  (-[-\w]+)", sections["options"], re.MULTILINE) == ["-h"]  # the rest is grouped
    flags = re.findall(r"^  (--[\w-]+)", text, re.MULTILINE)
    assert len(flags) == len(set(flags)) >= 70


def test_serve_help_shows_each_default_once(capsys):
    entries = re.split(r"\n  (?=-)", _serve_help(capsys))[1:]
    by_flag = {e.split()[0].rstrip(","): " ".join(e.split()) for e in entries}
    assert [f for f, e in by_flag.items() if e.count("(default") > 1] == []
    assert by_flag["--http-port"].endswith("(0 = any free) (default: 8000)")
    assert by_flag["--log-file"].endswith("(default: standard error)")  # said in words, not ": )"
    assert by_flag["--strict-readiness"].endswith("(default: true)")  # Triton's spelling of a boolean
    assert by_flag["--repository-events"].endswith("(default: true)")
    assert "(default" not in by_flag["--allow-python-model-upload"]  # a switch: off unless given
    assert "(default" not in by_flag["--load-model"]  # repeatable, none unless given


@pytest.mark.parametrize(("flags", "expected"), [
    ((), None), (("--kv-cache-memory-bytes", "512MiB"), 512 << 20),
    (("--kv-cache-memory-bytes=2GB",), 2 * 10**9), (("--kv-cache-memory-bytes", "1048576"), 1 << 20),
])
def test_the_kv_cache_budget_takes_bytes_or_a_unit(flags, expected):
    assert _serve(*flags).kv_cache_memory_bytes == expected


@pytest.mark.parametrize("size", ["lots", "0", "1e9"])
def test_a_kv_cache_budget_it_cannot_read_is_refused_naming_the_flag(size, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _serve("--kv-cache-memory-bytes", size)
    assert exit_info.value.code == 2
    assert "argument --kv-cache-memory-bytes: expected a size" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_a_port_out_of_range_is_refused_naming_the_flag(port, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _serve("--grpc-port", port)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"argument --grpc-port: expected a port number (0 to 65535), got '{port}'" in error


def test_rate_limit_resources_take_tritons_name_count_and_optional_device():
    args = _serve("--rate-limit-resource", "R1:10", "--rate-limit-resource", "R2:5:0",
                  "--rate-limit-resource=R2:8:1")
    assert args.rate_limit_resource == [("R1", 10, None), ("R2", 5, 0), ("R2", 8, 1)]


@pytest.mark.parametrize("value", ["R", "R:", "R:x", ":3", "R:3:", "R:3:gpu0", "R:3:0:1", "R:-1"])
def test_a_rate_limit_resource_it_cannot_read_is_refused_naming_the_flag(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _serve("--rate-limit-resource", value)
    assert exit_info.value.code == 2
    assert (f"argument --rate-limit-resource: expected NAME:COUNT or NAME:COUNT:DEVICE, got '{value}'"
            in capsys.readouterr().err)


@pytest.mark.parametrize(("flags", "allowed", "interval_ms"), [
    ((), True, 2000),
    (("--allow-gpu-metrics=false", "--metrics-interval-ms", "500"), False, 500),
    (("--allow-gpu-metrics", "true"), True, 2000),
])
def test_gpu_metrics_flags_are_tritons(flags, allowed, interval_ms):
    args = _serve(*flags)
    assert (args.allow_gpu_metrics, args.metrics_interval_ms) == (allowed, interval_ms)
