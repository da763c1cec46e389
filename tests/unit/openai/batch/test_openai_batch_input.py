"""The Batch API's pure parts: the multipart/form-data split (engine/openai/batch/multipart.py), the input
file's checks and lazy reading (input.py), who owns what (owners.py), as plain functions; the result files'
torn last line (JobStore.read_done) and the file store's quotas (FileStore) on a temporary folder."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from engine.access.api_keys import parse_api_keys
from engine.openai.batch.files import FileStore
from engine.openai.batch.input import InputReader, check_upload, parse_input, scan_input
from engine.openai.batch.jobs import JobStore
from engine.openai.batch.limits import BatchLimits
from engine.openai.batch.multipart import MAX_PARTS, parse_form
from engine.openai.batch.owners import KEYLESS, Owners
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


def test_a_fields_data_is_a_view_of_the_body_not_a_copy():
    body = bytearray(form("b", ("file", "f.jsonl", b"x" * 1000)))
    data = parse_form(b"multipart/form-data; boundary=b", body)["file"].data
    assert data.obj is body and data.nbytes == 1000


@pytest.mark.parametrize("content_type, body", [
    (b"application/json", b"{}"),
    (b"multipart/form-data", b"--x\r\n"),
    (b"multipart/form-data; boundary=x", b"no parts at all"),
    (b"multipart/form-data; boundary=x", b"--x\r\nContent-Disposition: form-data; name=a\r\nno blank--x--"),
    (b"multipart/form-data; boundary=x", b"--x\r\n" + b"H: v\r\n" * 4000 + b"\r\n\r\ndata\r\n--x--"),
])
def test_a_body_that_is_no_form_is_a_400(content_type: bytes, body: bytes):
    with pytest.raises(OpenAIError) as err:
        parse_form(content_type, body)
    assert err.value.status == 400


def test_a_form_of_more_parts_than_the_cap_is_refused_before_any_part_is_read():
    fine = form("b", *[(f"f{i}", None, b"") for i in range(MAX_PARTS)])
    assert len(parse_form(b"multipart/form-data; boundary=b", fine)) == MAX_PARTS
    with pytest.raises(OpenAIError) as err:
        parse_form(b"multipart/form-data; boundary=b", b"--b\r\n\r\n\r\n" * 100_000 + b"--b--")
    assert err.value.status == 400 and f"more than {MAX_PARTS} parts" in err.value.message


def test_an_upload_is_counted_and_checked_without_decoding_it_whole():
    data = b'{"a": 1}\n\n  \n{"b": "\xc3\xa9"}\r\n{"c": 3}'
    assert check_upload(memoryview(data), 10) == 3
    with pytest.raises(OpenAIError) as err:
        check_upload(b"x\n" * 2_000_000 + b"\xff", 10_000_000)  # past the first chunk, at its exact byte
    assert err.value.code == "invalid_file" and "byte 4000000" in err.value.message
    with pytest.raises(OpenAIError) as err:
        check_upload(b"x\n" * 11, 10)
    assert err.value.code == "too_many_requests"
    with pytest.raises(OpenAIError) as err:
        check_upload(b" \n\r\n\t\n", 10)
    assert err.value.code == "empty_file"


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
    expected = [("invalid_json_line", 2), ("invalid_json_line", 3), ("missing_required_parameter", 4),
                ("duplicate_custom_id", 5), ("invalid_method", 6), ("mismatched_endpoint", 7),
                ("invalid_request", 8)]
    assert [(e["code"], e["line"]) for e in errors] == expected
    count, scanned = scan_input(io.BytesIO(data), "/v1/completions")  # what a job checks, line by line
    assert count == 1 and scanned == errors


def test_an_empty_file_fails():
    assert parse_input(b"\n\n", "/v1/completions")[1][0]["code"] == "empty_file"
    assert scan_input(io.BytesIO(b"\n\n"), "/v1/completions")[1][0]["code"] == "empty_file"


def test_the_reader_hands_out_requests_a_few_at_a_time_skipping_those_done():
    data = b"\n".join([req(f"r{i}") if i % 3 else b"" for i in range(1, 13)])  # lines 3, 6, 9, 12 blank
    reader = InputReader(io.BytesIO(data), "/v1/completions", [1, 5, 11])
    got = []
    while batch := reader.read(3):
        assert len(batch) <= 3
        got += [(x.line, x.custom_id) for x in batch]
    assert got == [(i, f"r{i}") for i in (2, 4, 7, 8, 10)]


def test_a_torn_last_result_line_is_cut_off_and_runs_again(tmp_path: Path):
    store = JobStore(tmp_path)
    batch_id = "batch_" + "1" * 32

    def result(line: int) -> bytes:
        answer = {"custom_id": f"c{line}", "response": {"request_id": f"{batch_id}-{line}"}}
        return json.dumps(answer).encode()

    path = store.result_path(batch_id, errors=False)
    path.write_bytes(result(4) + b"\n" + result(2) + b"\n" + result(7)[:30])
    store.result_path(batch_id, errors=True).write_bytes(result(3) + b"\n")
    done, ok, failed = store.read_done(batch_id)
    assert list(done) == [2, 3, 4] and (ok, failed) == (1 + 1, 1)
    assert path.read_bytes().endswith(b"}\n")


def test_an_owner_follows_its_keys_secret_not_its_place_in_the_file():
    one = parse_api_keys({"keys": [{"key": "k-a", "groups": ["inference"]},
                                   {"key": "k-b", "groups": ["inference"]}]})
    swapped = parse_api_keys({"keys": [{"key": "k-b", "groups": ["inference"]},
                                       {"key": "k-a", "groups": ["inference"]}]})
    a = one[0].owner
    assert swapped[1].owner == a and one[1].owner != a
    assert Owners(one).of_request(a) == a and Owners(swapped).known(a)
    with pytest.raises(OpenAIError) as err:  # no configured key's: a keyless request to a server with keys
        Owners(one).of_request(KEYLESS)
    assert err.value.status == 401
    assert Owners(()).of_request(KEYLESS) == KEYLESS and Owners(()).known(KEYLESS)
    assert not Owners(one).known(KEYLESS)  # a keyless server's files belong to nobody once keys exist
    assert not Owners(parse_api_keys({"keys": [{"key": "k-b", "groups": ["*"]}]})).known(a)  # a key removed


def test_each_owner_has_its_own_file_count_and_byte_quota(tmp_path: Path):
    store = FileStore(tmp_path, BatchLimits(max_storage_bytes_per_key=100, max_files_per_key=2))
    first = store.reserve("a", 60)
    store.register("a", store.write_upload("a", "f", "batch", b'{"x": 1}\n' * 6 + b"{}\n"), first)
    with pytest.raises(OpenAIError) as err:
        store.reserve("a", 50)  # 60 + 50 > 100 bytes
    assert err.value.status == 400 and err.value.code == "quota_exceeded"
    store.register("b", store.write_upload("b", "f", "batch", b"{}\n"), store.reserve("b", 3))  # b's own
    second = store.reserve("a", 10)
    with pytest.raises(OpenAIError):
        store.reserve("a", 1)  # a third file, even a small one
    store.release(second)
    doc = store.write_output("a", "out.jsonl", None)  # a job's output lands past the quota
    store.register("a", doc, None)
    assert [d["id"] for d in store.list("a", None, 10, None, False)["data"]][-1] == doc["id"]
    with pytest.raises(OpenAIError) as err:
        store.get("b", doc["id"])
    assert err.value.status == 404
    reloaded = FileStore(tmp_path, BatchLimits(max_storage_bytes_per_key=100, max_files_per_key=2))
    assert reloaded.list("a", None, 10, None, False) == store.list("a", None, 10, None, False)
    for d in store.list("a", None, 10, None, False)["data"]:
        store.delete("a", d["id"])
    store.register("a", store.write_upload("a", "g", "batch", b"{}\n"), store.reserve("a", 90))
