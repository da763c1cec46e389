"""Embeddings: what an encoder model needs besides its graph to answer /v1/embeddings
(engine/openai/embedding_service.py runs a request through them):

    folder.py    what an embedding model's folder adds to its ONNX graph: the tokenizer, the pooling, the
                 normalization, the context and the Matryoshka dimensions (`EmbeddingFolder`)
    pooling.py   the graph's last_hidden_state → one vector per text: pooled, cut, normalized (pure numpy)
    model.py     `EmbeddingModel`: an ONNX instance model whose folder is read while it loads
    kind.py      the embedding kind of the repository's kind registry: configs with the `embedding` parameter

The graph itself is served by the ONNX backend behind its dynamic batcher like any instance model (its
config's `embedding` parameter marks it), so concurrent requests batch like any v2 request.
"""
