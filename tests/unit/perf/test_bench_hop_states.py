"""perf/bench_hop_states.py's replay of a scheduler trace: lines as `perf script -F
comm,pid,tid,cpu,time,event,trace` prints them (perf 6.x), states and shares worked out by hand."""

from __future__ import annotations

import pytest

from bench_hop_states import parse, placement, state_split, table, thread_ids

LOOP, STUB, CLIENT = 100, 200, 300


def switch(t: float, cpu: int, prev: int, state: str, nxt: int) -> str:
    """A sched_switch line at `t` seconds: `prev` leaves CPU `cpu` in `state` (R: still runnable)."""
    on = {LOOP: "python", STUB: "python", CLIENT: "perf_analyzer.b", 0: "swapper/0"}
    return (f"{on[prev]:>16} {prev}/{prev} [{cpu:03d}] {t:.6f}: sched:sched_switch: prev_comm={on[prev]} "
            f"prev_pid={prev} prev_prio=120 prev_state={state} ==> next_comm={on[nxt]} next_pid={nxt} "
            "next_prio=120")


def wakeup(t: float, cpu: int, waker: int, woken: int, target: int) -> str:
    return (f"          python {waker}/{waker} [{cpu:03d}] {t:.6f}: sched:sched_wakeup: comm=python "
            f"pid={woken} prio=120 target_cpu={target:03d}")


# 0-10 µs the loop runs on CPU 0, the stub sleeps, CPU 1 idle; at 10 the loop wakes the stub onto its own
# CPU (CPU 1 idle); at 12 the stub preempts it; at 40 the stub sleeps and the loop runs again; at 50 the loop
# sleeps; the trace ends at 60.
TRACE = [
    switch(0.000000, 1, CLIENT, "S", 0),
    switch(0.000000, 0, 0, "R", LOOP),
    wakeup(0.000010, 0, LOOP, STUB, 0),
    switch(0.000012, 0, LOOP, "R", STUB),
    switch(0.000040, 0, STUB, "S", LOOP),
    "some other line perf prints",
    switch(0.000050, 0, LOOP, "S", 0),
    switch(0.000060, 1, 0, "R", CLIENT),
]


def test_a_trace_reads_as_switches_and_wakeups() -> None:
    events = parse(TRACE)
    assert [e.name for e in events] == ["sched_switch", "sched_switch", "sched_wakeup", "sched_switch",
                                        "sched_switch", "sched_switch", "sched_switch"]
    assert events[2].t_us == pytest.approx(10.0) and events[2].fields["target_cpu"] == "000"
    assert thread_ids(events, LOOP) == {LOOP} and thread_ids(events, STUB) == {STUB}


def test_time_is_split_by_both_groups_states() -> None:
    split = state_split(parse(TRACE), {STUB}, {LOOP})
    # 0-10 loop runs, stub asleep; 10-12 stub runnable; 12-40 stub runs, loop preempted; 40-50 loop runs,
    # stub asleep; 50-60 both asleep.
    assert split == pytest.approx({("sleep", "run"): 20 / 60, ("runq", "run"): 2 / 60,
                                   ("run", "runq"): 28 / 60, ("sleep", "sleep"): 10 / 60})
    assert table(split)[2] == "| run | runq | 46.7 % |"


def test_a_wakeup_onto_the_wakers_cpu_beside_an_idle_one_is_counted() -> None:
    where = placement(parse(TRACE), {LOOP})
    assert (where.wakeups, where.on_own_cpu_other_idle) == (1, 1)
    assert (where.preempted, where.preempted_other_idle) == (1, 1)
    busy = [switch(0.0, 1, 0, "R", CLIENT), *TRACE[1:4]]  # CPU 1 runs the client: nothing was idle
    where = placement(parse(busy), {LOOP})
    assert (where.on_own_cpu_other_idle, where.preempted, where.preempted_other_idle) == (0, 1, 0)
