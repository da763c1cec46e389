"""The generation engine: plain and synchronous, like vLLM v1's core. `GenerationEngine.step()` is schedule →
execute → update, with no event loop, threads or sockets, so every policy here is tested as plain functions.

    request.py       SamplingParams, Request (a state machine: waiting → running ⇄ preempted → finished)
    block_pool.py    the blocks: free list, reference counts, chained block hashes for prefix sharing
    kv_manager.py    block tables per sequence, allocation, prefix lookup
    waiting.py       the waiting sequences of one scheduling class, admitted in turn across API requests
    scheduler.py     continuous batching, chunked prefill within a token budget, preemption by recompute
    runner.py        DecoderRunner: a step's chunks through the decoder, grouped; its KV layout chosen once
    decoder_model.py the ONNX session and what the runner learned about its inputs; a run's feed
    kv_blocks.py     the KV blocks' storage: gather contexts by slot, write new tokens back
    kv_layout.py     KVLayout, the seam: how the model takes its past (dense or shared buffers)
    dense_layout.py  past in as dense tensors, contexts right-aligned; present = past + new (Optimum's form)
    shared_layout.py one buffer per KV tensor bound as past and present, written in place (GQA)
    decode_group.py  the decode rows' dense past, kept between steps (present fed back as past)
    shared_group.py  the decode rows' buffers for a shared-KV model (GroupQueryAttention writes them in place)
    lora.py          LoRA adapters: on disk, loaded on demand, evicted LRU, fed to the runner per row
    sampler.py       greedy, temperature, top-k, top-p, per-request seeded generators, grammar masks
    grammar.py       structured output: specs, llguidance's compiled grammars (cached), per-request matchers
    proposer.py      speculative decoding's proposals: the Proposer seam, n-gram prompt lookup
    draft_proposer.py  a draft model's greedy proposals, its own keys and values per request
    backoff.py       a request stops proposing while its proposals do not pay for their measured cost
    verify.py        which proposals the model keeps: greedy prefix, or rejection sampling
    stopping.py      stop tokens, EOS, stop strings, max_tokens, the context limit
    tokenizer.py     byte-level, or tokenizer.json through the optional `tokenizers` package
    detokenize.py    a request's output as text, a token at a time
    engine.py        GenerationEngine: add_request, step, abort_request, stats
"""
