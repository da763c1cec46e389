"""The example and test models' builders, beside the server rather than in it: deterministic ONNX models
built from code (no downloads, byte for byte reproducible). `make models` runs `python -m
hubserve_models.examples model_repository`; the tests (tests/conftest.py, through hubserve_harness) and the
benchmarks import it. Needs the `onnx` package (the `examples` / `test` extras); the server never imports it.

    examples.py      the models by name (`EXAMPLES`), and the command that writes a repository's model files
    pipelines.py     the example pipelines' classifiers: fixed weights, the constants their Python steps hold
    tiny_decoder.py  a tiny decoder-only transformer in Optimum's `decoder_with_past` form (dense, shared-KV,
                     LoRA inputs), for the generation engine
    onnx_build.py    what every builder shares: the pinned opset and IR version, datatypes, graph tensors
"""
