"""Embeddings: what an encoder model needs besides its graph to answer /v1/embeddings
(engine/openai/embedding_service.py runs a request through them):

    folder.py    what an embedding model's folder adds to its ONNX graph: the tokenizer, the pooling, the
                 normalization, the context and the Matryoshka dimensions (`EmbeddingFolder`)
    pooling.py   the graph's last_hidden_state → one vector per text: pooled, cut, normalized (pure numpy)

The graph itself is an ordinary ONNX model of the repository (its config's `embedding` parameter marks it),
served by the ONNX backend behind its dynamic batcher, so concurrent requests batch like any v2 request.
"""
