"""A generative model over Triton's protocols (KServe v2 infer, gRPC streams, generate and generate_stream).

    model.py            `GenerativeModel`: a decoupled model over the version's `EngineDriver`
    signature.py        the tensors a generative model shows Triton's clients (its config auto-completed)
    request_options.py  a request's inputs and parameters → the prompt, the flags and `SamplingParams`
    kind.py             the generative kind: registered with the repository's kind registry
                        (engine/repository/kinds.py)
"""
