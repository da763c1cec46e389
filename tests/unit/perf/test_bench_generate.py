"""perf/bench_generate.py's closed loop counts what the clients asked for, whatever the engine's steps: a
multi-step decode hands out several tokens per output, and static batches compute tokens past a member's
end, yet `tokens` is always the sum of the requested lengths and every request's first token is one TTFT.
No timing is asserted (speed lives in the benchmark's own output, perf/README.md)."""

from __future__ import annotations

import pytest

import bench_generate


@pytest.fixture(scope="module")
def model() -> bench_generate.Model:
    return bench_generate.build_model("tiny", "shared")


@pytest.mark.parametrize("steps", [1, 8])
@pytest.mark.parametrize("mode", ["continuous", "static", "static-leave"])
def test_the_loop_counts_the_tokens_asked_for(model: bench_generate.Model, mode: str, steps: int):
    jobs = bench_generate.workload(12, seed=4, lengths="lognormal")
    out = bench_generate.run(bench_generate.make_engine(model, steps), jobs, 4, mode)
    assert out.tokens == sum(length for _, length in jobs)
    assert len(out.ttft) == len(jobs)
    if mode == "static":  # every batch member computes to the batch's longest
        assert out.computed > out.useful == out.tokens


@pytest.mark.parametrize("kv", ["dense", "shared"])
def test_continuous_runs_of_the_same_jobs_make_the_same_runs(kv: str):
    """What lets the benchmark replay a trace recorded earlier as the ceiling of the run it is about to
    make: the loop is driven by steps, not by the clock. Equal traces of two fresh engines, and a trace
    that depends on the jobs (so the comparison can fail)."""
    model = bench_generate.build_model("tiny", kv)
    jobs = bench_generate.workload(12, seed=4, lengths="lognormal")
    first, trace, _ = bench_generate.traced_run(model, jobs, 4, 1)
    again = bench_generate.traced_run(model, jobs, 4, 1)[1]
    others = bench_generate.workload(12, seed=5, lengths="lognormal")
    other = bench_generate.traced_run(model, others, 4, 1)[1]
    assert first.tokens == sum(length for _, length in jobs)
    assert len(trace) > len(jobs)
    assert again == trace
    assert other != trace
