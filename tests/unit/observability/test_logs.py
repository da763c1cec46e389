"""The access line's text form, written by engine/observability/logs.py: values a client chose cannot fake a
field or a line, whatever reaches the writer (the frontends refuse bad ids before that; this is the writer's
own guarantee). Runs the real writer into a real log file, no server."""

from __future__ import annotations

import shlex
from pathlib import Path

from engine.observability import logs


def test_a_text_access_line_quotes_values_that_could_fake_a_field_or_a_line(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    logs.configure(log_file=str(log_file), log_format="text", log_verbose=1)
    try:
        logs.access_line("simple", "1", "plain-id_1.2:3", "OK", 1000, 2000, 3000, 1)
        logs.access_line("my model", "", "a status=FAKE", "OK", 0, 0, 0, 1)
        logs.access_line("simple", "1", "x\nFORGED line", "OK", 0, 0, 0, 1)
        logs.access_line("simple", "1", 'q"uote\u2028sep', "OK", 0, 0, 0, 1)
    finally:
        logs.configure()  # back to standard error, as a fresh process
    lines = [line for line in log_file.read_text().splitlines() if logs.ACCESS_LOGGER in line]
    assert len(lines) == 4, lines
    assert lines[0].endswith("model=simple version=1 request_id=plain-id_1.2:3 status=OK queue_us=1 "
                             "compute_us=2 total_us=3 batch_size=1")
    assert 'model="my model" version= request_id="a status=FAKE" status=OK' in lines[1]
    assert 'request_id="x\\nFORGED line" status=OK' in lines[2]
    assert 'request_id="q\\"uote\\u2028sep" status=OK' in lines[3]
    for line in lines:  # read as a shell reads words: nothing a client sent reads as a field of its own
        fields = [word.split("=", 1)[0] for word in shlex.split(line.split(": ", 1)[1])]
        assert fields == ["model", "version", "request_id", "status", "queue_us", "compute_us", "total_us",
                          "batch_size"], line
