"""Every plug-in kind of model, registered with the repository's kind registry (engine/repository/kinds.py)
by importing it here. The server imports this module; so does anything else that builds a
`ModelRepository` meant to serve every kind (the tests' in-process repositories, perf/bench_channel.py).

The core (engine/model.py, engine/repository/, engine/observability/, engine/scheduling/'s batchers)
imports none of these: tests/unit/repository/test_kinds.py holds it to that.
"""

from __future__ import annotations

from .backends.python import kind as python_kind
from .embed import kind as embedding_kind
from .generate.triton import kind as generative_kind
from .scheduling.ensemble import kind as ensemble_kind

PLUGINS = (embedding_kind, ensemble_kind, generative_kind, python_kind)

__all__ = ["PLUGINS"]
