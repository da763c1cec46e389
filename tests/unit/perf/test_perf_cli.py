"""`hubserve perf`'s flags (perf/hubserve_perf/cli.py), pure: the parser only. The same flag means the same
thing in every mode (-f writes CSV, as perf_analyzer's -f; --json writes JSON), and each mode's help shows
every default once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hubserve_perf.cli import build_parser

MODES = {"sweep": [], "tune-window": ["tune-window", "--p95-budget-ms", "5"], "generate": ["generate"]}


def help_entries(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """Each flag's help, one line, by its longest name."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*argv, "--help"])
    assert exit_info.value.code == 0
    entries = re.split(r"\n  (?=-)", capsys.readouterr().out)[1:]
    return {max(re.findall(r"--[\w-]+", e.split("  ")[0]), key=len, default=e.split()[0]): " ".join(e.split())
            for e in entries}


@pytest.mark.parametrize("mode", MODES)
def test_f_writes_csv_and_json_writes_json_in_every_mode(mode: str) -> None:
    args = build_parser().parse_args([*MODES[mode], "-m", "simple", "-f", "out.csv", "--json", "out.json"])
    assert (args.csv, args.json) == (Path("out.csv"), Path("out.json"))


def test_generate_keeps_perf_analyzers_json_flag() -> None:
    args = build_parser().parse_args(["generate", "-m", "m", "--profile-export-file", "p.json"])
    assert args.json == Path("p.json") and args.csv is None


@pytest.mark.parametrize("mode", ["sweep", "tune-window", "generate"])
def test_every_mode_shows_each_default_once(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    entries = help_entries(MODES[mode][:1], capsys)
    assert [f for f, e in entries.items() if e.count("(default") > 1] == []
    assert "CSV" in next(e for e in entries.values() if e.startswith("-f "))


def test_the_defaults_shown_are_the_ones_used(capsys: pytest.CaptureFixture[str]) -> None:
    sweep = help_entries([], capsys)
    assert sweep["--measurement-interval"].endswith("(default: 5000)")
    assert sweep["--stability-percentage"].endswith("(default: 10.0)")
    assert sweep["--max-trials"].endswith("(default: 10)")
    assert sweep["--grpc-calls-per-connection"].endswith("(0: one connection) (default: 6)")
    assert sweep["--concurrency-range"].endswith("(default: 1)")
    assert "(default" not in sweep["--model-name"]
    tune = help_entries(["tune-window"], capsys)
    assert tune["--windows-us"].endswith("(default: 0,100,500,1000,2000,5000)")
    generate = help_entries(["generate"], capsys)
    assert generate["--max-duration-s"].endswith("(default: 120.0)")
    assert generate["--url"].endswith("(default: localhost:8000)")
    assert generate["--endpoint"].endswith("(default: chat)")
