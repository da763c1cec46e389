"""The generation engine: continuous batching over a paged KV cache for ONNX decoder models.

Plain and synchronous, like vLLM v1's core: `GenerationEngine.step()` is schedule → execute → update, with no
event loop, threads or sockets, so every policy here is tested as plain functions. docs/architecture.md
("Generation engine") describes the design and what it costs.

    tiny_decoder.py  the example model, built with the onnx helper API (needs `onnx`; never imported by the
                     server)
"""
