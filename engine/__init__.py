"""hubserve: a multi-model inference server speaking the KServe v2 / Triton protocol."""

__version__ = "0.1.0"
