"""The generation engine: continuous batching over a paged KV cache for ONNX decoder models.

Plain and synchronous, like vLLM v1's core: `GenerationEngine.step()` is schedule → execute → update, with no
event loop, threads or sockets, so every policy here is tested as plain functions. docs/architecture.md
("Generation engine") describes the design and what it costs.

    request.py       SamplingParams, Request (a state machine: waiting → running ⇄ preempted → finished)
    block_pool.py    the blocks: free list, reference counts, chained block hashes for prefix sharing
    kv_manager.py    block tables per sequence, allocation, prefix lookup
    scheduler.py     continuous batching, chunked prefill within a token budget, preemption by recompute
    runner.py        the ONNX decoder session and the KV storage: block tables ↔ dense past tensors
    decode_group.py  the decode rows' dense past, kept between steps (present fed back as past)
    shared_group.py  the decode rows' buffers for a shared-KV model (GroupQueryAttention writes them in place)
    sampler.py       greedy, temperature, top-k, top-p, per-request seeded generators
    stopping.py      stop tokens, EOS, stop strings, max_tokens, the context limit
    tokenizer.py     byte-level, or tokenizer.json through the optional `tokenizers` package
    engine.py        GenerationEngine: add_request, step, abort_request, stats
    model_folder.py  a model folder's config parameters → a GenerationEngine
    tiny_decoder.py  the example model (dense, or its shared-KV form), built with the onnx helper API (needs
                     `onnx`; never imported by the server)
"""
