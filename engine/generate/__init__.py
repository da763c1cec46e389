"""Generative models: continuous batching over a paged KV cache for ONNX decoder models, and serving it.

    core/     the engine itself, plain and synchronous like vLLM v1's core: `GenerationEngine.step()` is
              schedule → execute → update, with no event loop, threads or sockets, so every policy in it is
              tested as plain functions
    serving/  the engine served: one thread per engine driven from the loop (`EngineDriver`), one per
              generative model version (`GenerationRegistry`), model folders, chat templates, metrics and
              the statistics a generation request counts in
    triton/   a generative model as Triton's clients see it: a decoupled model over the driver, its tensors
              and how a request's inputs and parameters become sampling options

The OpenAI API over the same engines is engine/openai/. docs/generative.md ("How the engine works") describes
the design and what it costs.
"""
