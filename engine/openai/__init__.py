"""The OpenAI-compatible API over the generation engine, transport aside (the HTTP routes are in
engine/frontend/openai/).

    protocol.py      request bodies checked into ApiRequest, with OpenAI's 400s
    structured.py    response_format and vLLM's structured_outputs checked into one GrammarSpec
    service.py       a request → prompt → limits → a Generation → the answer
    generation.py    one API request's choices in the engine and what they produced
    responses.py     OpenAI's answer, chunk and logprobs shapes
    errors.py        OpenAI's error object; the engine's errors mapped once
    token_quotas.py  per-key tokens_per_minute
    embeddings.py    /v1/embeddings' body checked into EmbeddingRequest, and its answer
    embedding_service.py  an embeddings request → token ids → padded batches through the model's dynamic
                     batcher → pooled vectors (the folder's parts: engine/embed/)
    batch/           the Files and Batch APIs: offline jobs through the same engine
"""
