"""The Batch API's pure parts: the multipart/form-data split (engine/openai/batch/multipart.py) and the input
file's line checks (engine/openai/batch/jobs.py parse_input), as plain functions; the result files' torn
last line (JobStore.read_results) on a temporary folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.openai.batch.jobs import JobStore, parse_input
from engine.openai.batch.multipart import parse_form
from engine.openai.errors import OpenAIError


def form(boundary: str, *parts: tuple[str, str | None, bytes]) -> bytes:
    out = b"preamble\r\n"
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def test_a_form_splits_into_its_fields_with_their_bytes_intact():
    data = b"line one\r\n\r\nline two --not-the-boundary\n"
    body = form("XyZ", ("purpose", None, b"batch"), ("file", "in.jsonl", data))
    fields = parse_form(b'multipart/form-data; boundary="XyZ"', body)
    assert fields["purpose"].data == b"batch" and fields["purpose"].filename is None
    assert fields["file"].data == data and fields["file"].filename == "in.jsonl"


@pytest.mark.parametrize("content_type, body", [
    (b"application/json", b"{}"),
    (b"multipart/form-data", b"--x\r\n"),
    (b"multipart/form-data; boundary=x", b"no parts at all"),
    (b"multipart/form-data; boundary=x", b"--x\r\nContent-Disposition: form-data; name=a\r\nno blank--x--"),
])
def test_a_body_that_is_no_form_is_a_400(content_type: bytes, body: bytes):
    with pytest.raises(OpenAIError) as err:
        parse_form(content_type, body)
    assert err.value.status == 400


def req(custom_id: object = "a", url: str = "/v1/completions", method: str = "POST", body: object = None
        ) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url,
                       "body": {"model": "m"} if body is None else body}).encode()


def test_good_lines_become_requests_and_blank_lines_are_skipped():
    lines, errors = parse_input(b"\n".join([req("a"), b"", req("b")]) + b"\n", "/v1/completions")
    assert errors == [] and [(x.line, x.custom_id) for x in lines] == [(1, "a"), (3, "b")]


def test_each_bad_line_is_named_with_openais_code():
    data = b"\n".join([req("a"), b"[1]", b"{bad", req(""), req("a"), req("c", method="GET"),
                       req("d", url="/v1/chat/completions"), req("e", body=[1])])
    lines, errors = parse_input(data, "/v1/completions")
    assert [(e["code"], e["line"]) for e in errors] == [
        ("invalid_json_line", 2), ("invalid_json_line", 3), ("missing_required_parameter", 4),
        ("duplicate_custom_id", 5), ("invalid_method", 6), ("mismatched_endpoint", 7), ("invalid_request", 8)]


def test_an_empty_file_fails():
    assert parse_input(b"\n\n", "/v1/completions")[1][0]["code"] == "empty_file"


def test_a_torn_last_result_line_is_cut_off_and_runs_again(tmp_path: Path):
    store = JobStore(tmp_path)
    path = store.result_path("batch_" + "1" * 32, errors=False)
    path.write_bytes(b'{"custom_id": "a"}\n{"custom_id": "b"}\n{"custom_id": "c", "resp')
    assert store.read_results("batch_" + "1" * 32, errors=False) == {"a", "b"}
    assert path.read_bytes().endswith(b'"b"}\n')
