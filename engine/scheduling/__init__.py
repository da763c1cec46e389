"""What runs a model version's requests, and when: the schedulers between the data plane and the instances.

    inflight.py    `InflightBatcher`, the base the batchers share: requests in flight, their one done-callback
    timers.py      sub-millisecond timers for batching windows and queue timeouts
    batching/      dynamic batching: the pure `BatchPolicy`, the asyncio `Batcher` driving it, early dispatch
                   (`JoinForecast`) and the SLO-driven window
    sequence/      sequence batching (stateful models): the pure `SequencePolicy` and the `SequenceBatcher`
    ensemble/      ensembles: the pure planner, the driver (`EnsembleModel`) and how the repository loads them

Each folder pairs a pure, synchronous policy (tested without a loop) with the asyncio side that drives it.
"""
