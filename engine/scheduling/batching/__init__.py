"""Dynamic batching (Triton's `dynamic_batching`).

    policy.py           `BatchPolicy` (pure): priority queues, the window, preferred sizes, queue timeouts
    batcher.py          `Batcher`: drives the policy on the loop; futures, timers, execute, split
    join_forecast.py    `JoinForecast` (pure): early dispatch, the window cut short when no one else can join
    adaptive_window.py  `AdaptiveWindow` (pure): the largest window whose predicted p95 meets a latency target
"""
