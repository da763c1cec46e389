"""What the server tells about itself: statistics, metrics, logs, access lines, request ids and traces.

    stats.py        `ModelStats`: per-version counters, the one source of the statistics extension and metrics
    histograms.py   `Histogram`, and the request, queue and compute latency histograms
    metrics.py      every Prometheus family, rendered from the stats at scrape time
    gpu_metrics.py  Triton's GPU families, read through NVML on a thread of their own, shown by metrics.py
    generation.py   `GenerationSample`: what the metrics read of a generative version (its driver fills it)
    logs.py         the server's logging: where lines go, how they read, which levels pass; the access line
    observe.py      what an answered (or refused) inference owes beyond statistics: its access line, its spans
    request_life.py the one end of every request that reached a model: its outcome counted, then observed
    request_ids.py  what a client's request id may be, checked where it enters
    tracing/        Triton's trace extension: settings, and the OTLP/HTTP JSON exporter of spans
"""
