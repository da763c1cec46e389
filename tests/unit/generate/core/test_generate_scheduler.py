"""The scheduler (engine/generate/core/scheduler.py) as a plain object, with no model: the test plays the
model
by handing `update` a token for every request that samples."""

from __future__ import annotations

import numpy as np

from engine.generate.core.kv_manager import KVCacheManager
from engine.generate.core.request import FinishReason, Priority, Request, RequestState, SamplingParams
from engine.generate.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput


def make(num_blocks: int = 64, block_size: int = 4, seqs: int = 8, budget: int = 64,
         chunked: bool = True, prefix: bool = True) -> Scheduler:
    return Scheduler(SchedulerConfig(seqs, budget, chunked), KVCacheManager(num_blocks, block_size, prefix))


def request(rid: str, prompt_len: int, first: int = 0) -> Request:
    return Request(rid, list(range(first, first + prompt_len)), SamplingParams(max_tokens=100),
                   np.random.default_rng(0))


def step(s: Scheduler, token: int = 7) -> SchedulerOutput:
    out = s.schedule()
    sampled = {c.request.request_id: (token,) for c in out.chunks if c.sample}
    list(s.update(out, sampled))
    return out


def work(out: SchedulerOutput) -> dict[str, int]:
    return {c.request.request_id: len(c.token_ids) for c in out.chunks}


def test_requests_join_and_leave_at_every_step():
    s = make(seqs=2)
    a, b, c = request("a", 3), request("b", 5), request("c", 2)
    for r in (a, b, c):
        s.add(r)
    assert work(step(s)) == {"a": 3, "b": 5}  # two seats
    assert c.state is RequestState.WAITING
    assert work(step(s)) == {"a": 1, "b": 1}  # decoding
    s.finish(a, FinishReason.STOP)
    assert a.state is RequestState.FINISHED and a.finish_reason is FinishReason.STOP
    assert work(step(s)) == {"b": 1, "c": 2}  # c takes a's seat at once
    assert [r.request_id for r in s.running] == ["b", "c"]


def test_chunked_prefill_keeps_decodes_going_within_the_budget():
    s = make(budget=8)
    short, long = request("short", 2), request("long", 20, first=100)
    s.add(short)
    step(s)
    s.add(long)
    plan = step(s)
    assert work(plan) == {"short": 1, "long": 7}  # the decode first, then a chunk of what is left
    assert [c.sample for c in plan.chunks] == [True, False]  # a partial prompt samples nothing
    assert work(step(s)) == {"short": 1, "long": 7}
    last = step(s)
    assert work(last) == {"short": 1, "long": 6} and last.chunks[1].sample
    assert long.num_computed_tokens == 20 and long.output_token_ids == [7]


def test_without_chunking_a_prompt_waits_until_it_fits_the_budget():
    s = make(budget=8, chunked=False)
    s.add(request("short", 2))
    s.add(request("long", 9))
    assert work(step(s)) == {"short": 2}
    assert work(step(s)) == {"short": 1}  # 1 + 9 > 8: long keeps waiting


def test_preemption_frees_the_newest_and_recomputes_it_with_its_output():
    s = make(num_blocks=4, block_size=4, prefix=False)
    old, new = request("old", 7), request("new", 6, first=50)
    s.add(old)
    s.add(new)
    assert work(step(s)) == {"old": 7, "new": 6}  # 2 + 2 blocks: the pool is full
    assert work(step(s)) == {"old": 1, "new": 1}  # 8 and 7 tokens fit
    generated = list(new.output_token_ids)
    plan = step(s)  # old needs a 3rd block for its 9th token: new is preempted
    assert plan.preempted == ["new"] and work(plan) == {"old": 1}
    assert new.state is RequestState.PREEMPTED and new.num_computed_tokens == 0
    assert new.output_token_ids == generated  # nothing lost
    assert s.kv.block_table("new") == [] and s.waiting[0] is new
    s.finish(old, FinishReason.LENGTH)
    plan = step(s)
    assert work(plan) == {"new": 8} and plan.chunks[0].sample  # prompt + output, recomputed at once
    assert new.state is RequestState.RUNNING and new.num_preemptions == 1
    s.finish(new, FinishReason.STOP)
    assert s.kv.pool.num_free == 4 and not s.has_unfinished()


def test_admission_waits_for_free_blocks_instead_of_preempting():
    s = make(num_blocks=3, block_size=4, prefix=False)
    s.add(request("a", 8))
    s.add(request("b", 8, first=10))
    assert work(step(s)) == {"a": 8}  # b would need 2 more blocks; only 1 is free
    assert [r.request_id for r in s.waiting] == ["b"]


def test_a_shared_prefix_is_not_computed_again():
    s = make(block_size=4)
    a = request("a", 10)
    s.add(a)
    step(s)
    b = request("b", 10)  # the same prompt
    s.add(b)
    plan = step(s)
    assert work(plan) == {"a": 1, "b": 2} and b.num_cached_tokens == 8
    assert s.kv.block_table("b")[:2] == s.kv.block_table("a")[:2]


# ---------------------------------------------------------------------- priorities (batch jobs go last)

def batch_request(rid: str, prompt_len: int, first: int = 0) -> Request:
    return Request(rid, list(range(first, first + prompt_len)),
                   SamplingParams(max_tokens=100, priority=Priority.BATCH), np.random.default_rng(0))


def test_interactive_requests_are_admitted_before_earlier_batch_requests():
    s = make(seqs=2, budget=8)
    job = [batch_request(f"job{i}", 6, first=10 * i) for i in range(3)]
    for r in job:
        s.add(r)
    chat = request("chat", 4, first=200)
    s.add(chat)
    plan = step(s)
    assert work(plan) == {"chat": 4, "job0": 4}  # the budget goes to the interactive prompt first
    assert [c.request.request_id for c in plan.chunks][0] == "chat"
    assert [r.request_id for r in s.running] == ["chat", "job0"]
    assert [r.request_id for r in s.waiting] == ["job1", "job2"]


def test_running_interactive_requests_take_the_budget_before_batch_ones():
    s = make(budget=3)
    job = batch_request("job", 2)
    s.add(job)
    step(s)  # the job is decoding
    chats = [request(f"c{i}", 1, first=50 + i) for i in range(3)]
    for c in chats:
        s.add(c)
    step(s)
    plan = step(s)
    assert work(plan) == {"c0": 1, "c1": 1, "c2": 1}  # the job's decode waits a step; nobody is preempted
    assert job.state is RequestState.RUNNING and not plan.preempted


def test_an_interactive_request_preempts_a_batch_request_for_its_seat():
    s = make(seqs=2)
    jobs = [batch_request("j0", 3), batch_request("j1", 3, first=20)]
    for r in jobs:
        s.add(r)
    step(s)
    chat = request("chat", 3, first=40)
    s.add(chat)
    plan = step(s)
    assert plan.preempted == ["j1"] and work(plan) == {"chat": 3, "j0": 1}
    assert jobs[1].state is RequestState.PREEMPTED and s.waiting == [jobs[1]]
    assert jobs[1].output_token_ids == [7]  # nothing lost: recomputed once a seat frees
    s.finish(chat, FinishReason.STOP)
    assert work(step(s)) == {"j0": 1, "j1": 4}


def test_an_interactive_request_preempts_batch_requests_for_blocks():
    s = make(num_blocks=4, block_size=4, seqs=8)
    job = batch_request("job", 12)  # three of the four blocks
    s.add(job)
    step(s)
    chat = request("chat", 8, first=100)  # needs two
    s.add(chat)
    plan = step(s)
    assert plan.preempted == ["job"] and work(plan) == {"chat": 8}
    assert job.state is RequestState.PREEMPTED


def test_a_batch_request_never_preempts_an_interactive_one():
    s = make(num_blocks=4, block_size=4, seqs=1)
    chat = request("chat", 12)
    s.add(chat)
    step(s)
    job = batch_request("job", 8, first=100)
    s.add(job)
    plan = step(s)
    assert not plan.preempted and work(plan) == {"chat": 1} and job.state is RequestState.WAITING


# ------------------------------------------------------------------------------------------ fairness

def sequence(group: str, index: int, prompt_len: int = 3) -> Request:
    """One sequence of an API request `group` (its choice `index`)."""
    return Request(f"{group}-{index}", list(range(index, index + prompt_len)), SamplingParams(max_tokens=100),
                   np.random.default_rng(0), group=group)


def test_a_small_request_behind_a_large_fan_out_waits_for_one_of_its_sequences_not_all():
    """Issue 27: 8 prompts × n=16 queued first-in first-out held a later one-sequence request behind all 128.
    Admission takes the requests in turn, one sequence each."""
    s = make(seqs=2, num_blocks=256)
    big = [sequence("big", i) for i in range(6)]
    for r in big:
        s.add(r)
    step(s)  # big-0 and big-1 take both seats
    small = sequence("small", 0)
    s.add(small)
    assert [r.request_id for r in s.waiting][:2] == ["big-2", "small-0"]
    s.finish(big[0], FinishReason.STOP)
    s.finish(big[1], FinishReason.STOP)
    assert set(work(step(s))) == {"big-2", "small-0"}  # two seats freed: one to each request
    assert small.state is RequestState.RUNNING and [r.request_id for r in s.waiting] == ["big-3", "big-4",
                                                                                          "big-5"]


def test_requests_take_turns_one_sequence_each_in_arrival_order():
    s = make(seqs=1, num_blocks=256)
    for group, count in (("a", 3), ("b", 2), ("c", 1)):
        for i in range(count):
            s.add(sequence(group, i))
    order = []
    while s.has_unfinished():
        step(s)
        (running,) = s.running
        order.append(running.request_id)
        s.finish(running, FinishReason.STOP)
    assert order == ["a-0", "b-0", "c-0", "a-1", "b-1", "a-2"]


def test_one_sequence_requests_stay_first_in_first_out_and_the_preempted_go_first():
    s = make(num_blocks=4, block_size=4, prefix=False, seqs=2)
    old, new = request("old", 7), request("new", 6, first=50)
    later = [request(f"later{i}", 2, first=100 + 10 * i) for i in range(3)]
    for r in (old, new, *later):
        s.add(r)
    assert s.waiting == [old, new, *later]
    step(s)
    step(s)
    assert step(s).preempted == ["new"]  # old needs a third block
    assert s.waiting == [new, *later]  # first in line, ahead of requests that never ran
    s.finish(later[1], FinishReason.ABORT)  # an abort while waiting leaves the line
    assert s.waiting == [new, later[0], later[2]] and s.num_waiting == 3
