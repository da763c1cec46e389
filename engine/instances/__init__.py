"""Where a model version's batches run: its instances, one thread each, and what decides where and when.

    pool.py           `InstancePool`: a version's instances, acquired by its batcher and released after each
                      batch; the thread boundary
    placement.py      `place()` (pure): which device each instance runs on, from the instance groups
    devices.py        GPU discovery (CUDA_VISIBLE_DEVICES with CUDA's rules, nvidia-smi), kept apart so
                      placement is tested without a GPU
    rate_limiter.py   `RateLimiter`: server-wide caps across models on what executes at once; resources per
                      device unless global
    inline_policy.py  `InlinePolicy` (pure): which batches run in place on the loop (under 1 ms of CPU)
    warmup.py         `model_warmup` samples, run on every instance before a version is READY
    canary.py         canary readiness: a periodic synthetic inference on every instance
"""
