"""`hubserve perf`: a perf_analyzer-style load tester for KServe v2 / Triton servers, and the batching-window
tuner (`hubserve perf tune-window`).

The request path of one run, one module per stage:

    cli.py       flags → PerfOptions; runs a sweep or the window tuner; exit codes as perf_analyzer's
    control.py   metadata, config, statistics and repository load, over HTTP (aiohttp) or gRPC (grpc.aio)
    inputs.py    model metadata + --input-data/--shape/-b → the tensors of each request, encoded once
    client.py    the hot path: a lean HTTP/1.1 connection (binary tensors) and a raw-bytes gRPC stub
    grpc_h2.py   the gRPC hot path on HTTP/2 connections of our own (`--grpc-client h2`, the default)
    load.py      closed-loop (concurrency) and open-loop (request rate) load on one event loop → Records
    workers.py   the same load spread over several processes, each with its own event loop
    measure.py   measurement windows, the stability rule, server-stat deltas → StepResult
    report.py    table, perf_analyzer's CSV, JSON, latency–throughput plot
    tune.py      sweep max_queue_delay_microseconds through the repository API and recommend a window

and `hubserve perf generate`, the generative mode (OpenAI streamed completions, as genai-perf measures them):

    generative.py  synthetic seeded prompts, closed- or open-loop load, TTFT / inter-token / end-to-end
                   percentiles and tokens/s per point, table and JSON
    sse_client.py  the hot path: one streamed request on a raw HTTP/1.1 keep-alive connection, timestamped

A package of its own, beside the server rather than inside it: it is a client and talks to any server of the
protocol (hubserve or Triton). From the server package it takes only what describes the wire, never a stage
of the request path: the sans-I/O HTTP/2 core the server runs on (engine/frontend/h2/core.py, in the client
role, with its frames, HPACK, stream states and windows; none of it imports gRPC or the data plane), the
generated protobuf messages (engine/proto/) and the datatype table (engine.types.DataType).
tests/unit/perf/test_perf_layout.py checks that importing it loads no other server module, and that the server
never imports it.
"""
