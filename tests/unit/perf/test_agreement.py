"""perf/agreement.py's reading of a bistable server: which runs it compares with which.

The script itself needs perf_analyzer and minutes of load; what decides its verdict on a bistable point is
plain arithmetic over the runs, checked here on runs shaped like those measured (`mlp_large` at concurrency 4
settles into batches of 4 or into staggered pairs)."""

from __future__ import annotations

import agreement  # perf/agreement.py: pytest puts perf/ on sys.path (pythonpath in pyproject.toml)

PA, OURS = "perf_analyzer", "hubserve perf"


def run(tool: str, batch: float, throughput: float, p50_us: float = 15_000.0) -> agreement.Run:
    return agreement.Run(rep=0, model="mlp_large", tool=tool, protocol="http", load="c=4", rc=0,
                         throughput=throughput, p50_us=p50_us, server_us=0.0, avg_us=0.0, client_cpu_s=0.0,
                         server_cpu_s=0.0, wall_s=1.0, batch=batch)


def test_runs_in_two_server_states_are_compared_within_each_state() -> None:
    runs = [run(PA, 4.0, 290), run(PA, 2.1, 165, 24_000), run(PA, 4.0, 280),
            run(OURS, 2.2, 175, 23_000), run(OURS, 2.0, 170, 23_500), run(OURS, 4.0, 285)]
    groups = agreement.server_states(runs)
    assert [sorted(r.batch for r in g) for g in groups] == [[2.0, 2.1, 2.2], [4.0, 4.0, 4.0]]
    deviation, note = agreement.compare_states(groups)
    # pairs: 172.5/165 = 1.045; 285/285 = 1.0; p50 23,250/24,000 = 0.969
    assert deviation is not None and abs(deviation - (172.5 / 165 - 1)) < 1e-9
    assert "batch 2.1: 1 + 2 runs" in note and "batch 4.0: 2 + 1 runs" in note


def test_a_state_only_one_tool_reached_is_named_but_not_compared() -> None:
    groups = agreement.server_states([run(PA, 4.0, 290), run(PA, 2.0, 165), run(OURS, 2.1, 300)])
    deviation, note = agreement.compare_states(groups)
    assert deviation is not None and abs(deviation - (300 / 165 - 1)) < 1e-9
    assert "(one tool only)" in note


def test_groups_that_split_by_tool_are_a_difference_between_the_tools_not_two_states() -> None:
    runs = [run(PA, 1.6, 2_900), run(PA, 1.7, 3_000), run(OURS, 2.3, 3_600), run(OURS, 2.4, 3_500)]
    assert agreement.server_states(runs) == []


def test_batch_sizes_within_the_gap_are_one_state() -> None:
    runs = [run(PA, 1.65, 2_900), run(OURS, 1.95, 3_300), run(PA, 1.9, 3_000), run(OURS, 2.0, 3_400)]
    assert agreement.server_states(runs) == []
