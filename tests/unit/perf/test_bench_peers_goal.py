"""What `perf/bench_peers.py` computes for issue 32's goal table (perf/peers/goal.py) from recorded per-point
numbers, and the repository and command line it gives Triton's C++ onnxruntime backend (`triton-ort`). No
Triton here: the table is pure, the repository is files, and `--goal-from` prints from a recorded run."""

from __future__ import annotations

import json
import math
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from google.protobuf import text_format

from conftest import EXAMPLES, ROOT
from engine.proto import model_config_pb2 as pb
from hubserve_harness.perf_analyzer import children_usage
from hubserve_models import examples
from peers import goal, report, repos, servers
from peers.report import Measurement, Point


def m(server: str, model: str, protocol: str, c: int, infer_per_s: float, p99_ms: float,
      cpu_us: float, error: str = "") -> Measurement:
    return Measurement(Point(model, "tuned", protocol, c), server, infer_per_s, p99_ms=p99_ms,
                       cpu_us_per_infer=cpu_us, error=error)


# simple over gRPC as issue 32 recorded it (ratios 8.94 / 1.45 / 0.78), and `image` (the issue's `big`)
# over HTTP with its c = 32 point lost on Triton's side; a `triton` stand-in row the table must ignore.
RUN = [
    m("hubserve", "simple", "grpc", 1, 894.0, 0.19, 91),
    m("triton-ort", "simple", "grpc", 1, 100.0, 1.40, 183),
    m("triton", "simple", "grpc", 1, 50.0, 9.0, 999),
    m("hubserve", "simple", "grpc", 16, 1450.0, 2.06, 46),
    m("triton-ort", "simple", "grpc", 16, 1000.0, 2.45, 44),
    m("hubserve", "simple", "grpc", 32, 780.0, 4.68, 48),
    m("triton-ort", "simple", "grpc", 32, 1000.0, 3.64, 39),
    m("hubserve", "image", "http", 1, 544.0, 0.52, 156),
    m("triton-ort", "image", "http", 1, 100.0, 1.95, 428),
    m("hubserve", "image", "http", 16, 107.0, 9.07, 183),
    m("triton-ort", "image", "http", 16, 100.0, 10.26, 333),
    m("hubserve", "image", "http", 32, 107.0, 22.03, 184),
    m("triton-ort", "image", "http", 32, 0.0, 0.0, 0.0, error="perf_analyzer exit 1: timed out"),
]


def by_key(points: list[goal.GoalPoint]) -> dict[tuple[str, str, int], goal.GoalPoint]:
    return {(p.model, p.protocol, p.concurrency): p for p in points}


def test_each_point_pairs_hubserve_with_the_cpp_backend_and_checks_each_goal() -> None:
    points = by_key(goal.goal_points(RUN, "hubserve", "tuned"))
    assert len(points) == 6
    c1, c16, c32 = (points["simple", "grpc", c] for c in (1, 16, 32))
    assert c1.anchor is not None and c1.anchor.server == "triton-ort"  # never the stand-in
    assert [round(p.ratio, 2) for p in (c1, c16, c32)] == [8.94, 1.45, 0.78]
    assert [p.cpu_goal for p in (c1, c16, c32)] == [False, False, True]
    assert c1.misses == [] and c16.misses == []  # c16's CPU is above Triton's, but that goal is c = 32's
    assert c32.misses == ["throughput", "p99", "CPU"]
    lost = points["image", "http", 32]
    assert not lost.measured and lost.misses == ["not measured"] and math.isnan(lost.ratio)


def test_the_table_has_the_issues_shape_with_misses_in_bold_and_a_verdict() -> None:
    lines = goal.render(goal.goal_points(RUN, "hubserve", "tuned"))
    simple = next(ln for ln in lines if ln.startswith("| simple | grpc |"))
    cells = [c.strip() for c in simple.strip("|").split("|")]
    assert cells == ["simple", "grpc", "1 / 16 / 32", "8.94 / 1.45 / **0.78**",
                     "0.19 / 1.40 · 2.06 / 2.45 · **4.68** / 3.64", "91 / 183 · 46 / 44 · **48** / 39",
                     "c=32: throughput, p99, CPU"]
    image = next(ln for ln in lines if ln.startswith("| image (big) | http |"))
    assert "— / —" in image and "c=32: not measured" in image
    assert "- throughput ≥ 1.0 ×: 4 of 6 points" in lines
    assert "- p99 ≤ the anchor's: 4 of 6 points" in lines
    assert "- CPU per inference ≤ the anchor's at c = 32: 0 of 2 points" in lines
    assert lines[-1] == "- **goal does not hold** (1 point not measured)"


def test_a_run_that_meets_every_goal_says_so() -> None:
    run = [m("hubserve", "mlp", p, c, 130.0, 1.0, 40) for p in ("grpc", "http") for c in (1, 32)]
    run += [m("triton-ort", "mlp", p, c, 100.0, 1.5, 45) for p in ("grpc", "http") for c in (1, 32)]
    lines = goal.render(goal.goal_points(run, "hubserve", "tuned"))
    assert "- aim, ≥ 1.2 × at c = 32: 2 of 2 points" in lines
    assert lines[-1] == "- **goal holds**"


def test_goal_from_prints_the_table_from_a_recorded_run(tmp_path: Path) -> None:
    recorded = tmp_path / "peers-run.json"
    recorded.write_text(report.dump(RUN, "hubserve"))
    assert report.load(recorded.read_text()) == (RUN, "hubserve")
    out = subprocess.run([sys.executable, str(ROOT / "perf/bench_peers.py"), "--goal-from", str(recorded)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "| simple | grpc | 1 / 16 / 32 | 8.94 / 1.45 / **0.78** |" in out.stdout
    assert "### Goal table, config `tuned`: hubserve against Triton's C++ onnxruntime backend" in out.stdout


def test_each_point_keeps_the_clients_cpu_and_the_machines_idle_share_and_older_runs_still_load() -> None:
    """A loss with the machine idle is latency, not CPU per inference (report.Measurement): both numbers
    survive the JSON a run writes, and a run recorded before them loads with neither."""
    point = m("hubserve", "mlp", "grpc", 32, 14879.0, 3.98, 51)
    measured = Measurement(point.point, "hubserve", 14879.0, p99_ms=3.98, cpu_us_per_infer=51,
                           client_cpu_us_per_infer=51.0, machine_idle=0.25, client_faults_per_infer=80.5,
                           client_switches_per_infer=2.4, client_peak_rss_mb=3931.5)
    assert report.load(report.dump([measured, point], "hubserve")) == ([measured, point], "hubserve")
    run = json.loads(report.dump([point], "hubserve"))  # a run recorded before these fields
    for name in ("client_cpu_us_per_infer", "machine_idle", "client_faults_per_infer",
                 "client_switches_per_infer", "client_peak_rss_mb"):
        del run["measurements"][0][name]
    assert report.load(json.dumps(run)) == ([point], "hubserve")
    table = "\n".join(report.point_table({measured.point: {"hubserve": measured}}))
    assert "| 51 | 80 / 2.4 | 3,932 | 25 |" in table
    idle0, all0 = servers.machine_cpu_ticks()
    deadline = time.monotonic() + 0.1
    while time.monotonic() < deadline:  # busy: the clock ticks count this core as used
        pass
    idle1, all1 = servers.machine_cpu_ticks()
    assert 0 <= idle0 <= all0 and idle1 >= idle0 and all1 > all0 and idle1 - idle0 < all1 - all0


def test_rounds_take_each_numbers_median_so_one_stalled_round_does_not_decide_a_point() -> None:
    """--rounds: a server's point is the median of its rounds, number by number (the p99 of one round and the
    throughput of another can both be the middle); a failed round is left out; every round failing keeps the
    error; the rounds survive the JSON beside the medians, which `load` reads as before."""
    point = Point("image", "tuned", "http", 32)
    rounds = [
        Measurement(point, "hubserve", 2100.0, p99_ms=71.1, cpu_us_per_infer=390, avg_batch=4.0),  # stalled
        Measurement(point, "hubserve", 2200.0, p99_ms=56.3, cpu_us_per_infer=float("nan"), avg_batch=4.4),
        Measurement(point, "hubserve", 0.0, error="perf_analyzer exit 2: unstable"),
        Measurement(point, "hubserve", 1900.0, p99_ms=53.6, cpu_us_per_infer=380, avg_batch=None),
    ]
    median = report.median_of(rounds)
    assert (median.infer_per_s, median.p99_ms, median.cpu_us_per_infer, median.avg_batch) == (
        2100.0, 56.3, 385.0, 4.2)
    assert median.error == "" and median.point == point and median.server == "hubserve"
    failed = [rounds[2], replace(rounds[2], error="perf_analyzer exit 124: timed out")]
    assert report.median_of(failed) == failed[-1]
    anchor = [replace(r, server="triton-ort", p99_ms=r.p99_ms + 1) for r in rounds if not r.error]
    text = report.dump([median], "hubserve", [rounds + anchor])
    assert report.load(text) == ([median], "hubserve")
    assert len(json.loads(text)["rounds"][0]) == 7
    table = report.rounds_table([rounds + anchor])
    row = "| image | tuned | http | 32 | {} | {} | {} |".format
    assert row("hubserve", "2,100 / 2,200 / failed / 1,900", "71.10 / 56.30 / failed / 53.60") in table
    assert row("triton-ort", "2,100 / 2,200 / 1,900", "72.10 / 57.30 / 54.60") in table


def test_each_round_alone_is_counted_beside_the_medians_verdict(tmp_path: Path) -> None:
    """A `--rounds` run says how each round alone would have read, so a verdict of medians shows what it owes
    to them; `--goal-from` prints those lines from the JSON too."""
    point = Point("simple", "tuned", "http", 16)
    rounds = [[
        Measurement(point, "hubserve", 11000.0, p99_ms=2.5, cpu_us_per_infer=70),
        Measurement(point, "triton-ort", 9000.0, p99_ms=2.7, cpu_us_per_infer=90),
        Measurement(point, "triton-ort", 9100.0, p99_ms=2.6, cpu_us_per_infer=90),
        Measurement(point, "hubserve", 10800.0, p99_ms=2.9, cpu_us_per_infer=70),  # a stalled round
        Measurement(point, "hubserve", 11100.0, p99_ms=2.4, cpu_us_per_infer=70),
        Measurement(point, "triton-ort", 8900.0, p99_ms=2.8, cpu_us_per_infer=90),
    ]]
    lines = goal.by_round(rounds, "hubserve", "tuned")
    assert lines == [
        "- round 1 alone: throughput ≥ 1.0 ×: 1 of 1 points; p99 ≤ the anchor's: 1 of 1 points; CPU per "
        "inference ≤ the anchor's at c = 16: 1 of 1 points; the goal holds",
        "- round 2 alone: throughput ≥ 1.0 ×: 1 of 1 points; p99 ≤ the anchor's: 0 of 1 points; CPU per "
        "inference ≤ the anchor's at c = 16: 1 of 1 points; the goal does not hold",
        "- round 3 alone: throughput ≥ 1.0 ×: 1 of 1 points; p99 ≤ the anchor's: 1 of 1 points; CPU per "
        "inference ≤ the anchor's at c = 16: 1 of 1 points; the goal holds",
    ]
    medians = [report.median_of([m for m in rounds[0] if m.server == s]) for s in ("hubserve", "triton-ort")]
    recorded = tmp_path / "peers-rounds.json"
    recorded.write_text(report.dump(medians, "hubserve", rounds))
    assert report.load_rounds(recorded.read_text()) == rounds
    out = subprocess.run([sys.executable, str(ROOT / "perf/bench_peers.py"), "--goal-from", str(recorded)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "| simple | http | 16 | 1.22 | 2.50 / 2.70 | 70 / 90 | none |" in out.stdout
    assert lines[1] in out.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> list[repos.ServedModel]:
    """`simple` (a pbtxt with a window) and `image` (`dynamic_batching { }`) as committed, models built."""
    root = tmp_path_factory.mktemp("examples")
    for name in ("simple", "image"):
        (root / name).mkdir()
        for config in (EXAMPLES / name).glob("config.*"):
            shutil.copy(config, root / name / config.name)
    examples.build_repository(root, ["simple", "image"])
    return [repos.served_model(root, name) for name in ("simple", "image")]


def test_the_cpp_backends_repository_is_the_onnx_file_and_hubserves_batching(
        built: list[repos.ServedModel], tmp_path: Path) -> None:
    stale = tmp_path / "old_model" / "1"
    stale.mkdir(parents=True)
    (stale / "model.onnx").write_bytes(b"")  # written by an earlier run for a model not asked for now
    repos.write_triton_ort_repo(built, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image", "simple"]
    for model in built:
        folder = tmp_path / model.name
        assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) == [
            "1", "1/model.onnx", "config.pbtxt"]  # no model.py: the C++ backend runs the file itself
        assert (folder / "1/model.onnx").read_bytes() == model.onnx_path.read_bytes()
        config = text_format.Parse((folder / "config.pbtxt").read_text(), pb.ModelConfig())
        assert (config.name, config.backend) == (model.name, "onnxruntime")
        assert config.max_batch_size == model.config.max_batch_size
        assert config.dynamic_batching.max_queue_delay_microseconds == model.max_queue_delay_us
        assert [(i.name, list(i.dims)) for i in config.input] == [
            (s.name, list(s.dims)) for s in model.config.inputs]
        assert [(g.count, g.kind) for g in config.instance_group] == [
            (model.instance_count, pb.ModelInstanceGroup.KIND_CPU)]


def test_triton_ort_runs_onnx_runtime_at_one_thread_from_its_own_backend_directory() -> None:
    command = servers.KINDS["triton-ort"].command(servers.Ports(1, 2, 3), ["simple"])
    assert command[0].endswith(".peers/triton_ort/bin/tritonserver")
    assert command[command.index("--backend-directory") + 1].endswith(".peers/triton_ort/backends")
    assert {"--backend-config=onnxruntime,enable-global-threadpool=1",
            "--backend-config=onnxruntime,intra_op_thread_count=1",
            "--backend-config=onnxruntime,inter_op_thread_count=1"} <= set(command)


def test_the_clients_page_faults_and_switches_are_counted_once_it_ends() -> None:
    """bench_peers reads perf_analyzer's faults and switches from the ended children's usage: a child that
    touches 64 MiB of fresh pages shows at least half as many faults as that has 4 KiB pages."""
    before = children_usage()
    subprocess.run([sys.executable, "-c", "b = bytearray(64 << 20)"], check=True)
    used = children_usage() - before
    assert used.faults >= (64 << 20) // 4096 // 2  # fresh pages, faulted in (huge pages would count fewer)
    assert used.switches >= 0 and used.cpu_s > 0


def test_each_client_run_reports_its_own_peak_memory():
    """A point's perf_analyzer peak RSS is that run's own (reaped with wait4), not the largest of every child
    so far (RUSAGE_CHILDREN's): a small run after a big one reads small. Linux starts a child's count at its
    parent's RSS at the fork, so the big run grows well past this process's."""
    from hubserve_harness.perf_analyzer import run_reaped

    mine_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    grow = (mine_kib << 10) + (256 << 20)
    big = run_reaped((sys.executable, "-c", f"x = b'x' * {grow}"), 60)
    small = run_reaped((sys.executable, "-c", "print('small')"), 60)
    assert big[0] == 0 and not big[2] and big[3] > grow >> 10, big  # KiB
    assert small[:3] == (0, b"small\n", False) and small[3] < big[3] - (200 << 10), (small, big)
    slept = run_reaped((sys.executable, "-c", "import time; time.sleep(30)"), 0.5)
    assert slept[0] == 124 and slept[2], slept


def test_a_perf_analyzer_that_runs_out_of_time_is_told_from_one_that_fails():
    """bench_peers measures a point again with short windows only when perf_analyzer timed out (its summary
    stalling against Triton's HTTP at high rates), not when it failed: a real perf_analyzer against a port
    that accepts and never answers, and against one that refuses."""
    import socket

    import bench_peers
    from hubserve_harness.perf_analyzer import perf_analyzer_available, run_perf_analyzer

    if not perf_analyzer_available():
        pytest.fail("perf_analyzer is missing: `make perf-analyzer` (the test install has it)")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    try:
        stalled = run_perf_analyzer("simple", f"127.0.0.1:{silent.getsockname()[1]}", "http", timeout_s=3)
        refused = run_perf_analyzer("simple", f"127.0.0.1:{closed.getsockname()[1]}", "http", timeout_s=30)
    finally:
        silent.close()
        closed.close()
    point = Point("simple", "tuned", "http", 32)
    as_stalled = Measurement(point, "triton-ort", error=bench_peers.failure(stalled))
    as_refused = Measurement(point, "triton-ort", error=bench_peers.failure(refused))
    assert stalled.returncode == 124 and bench_peers.timed_out(as_stalled), as_stalled.error
    assert stalled.timed_out and "[perf_analyzer timed out after 3 s]" in stalled.output
    # each run reaped on its own (wait4): its own peak memory, a running binary's few MB at least
    assert stalled.peak_rss_mb is not None and stalled.peak_rss_mb > 1, stalled.peak_rss_mb
    assert refused.returncode not in (0, 124) and not bench_peers.timed_out(as_refused), as_refused.error
    assert not bench_peers.timed_out(m("hubserve", "simple", "http", 32, 100.0, 1.0, 50))
