"""Config variants of the side-by-side benchmark: each model as the examples configure it, and beside it as
configured for the throughput Triton reaches at its best here (issue 13: `max_batch_size: 64` and a 1000 µs
dynamic-batching window).

A variant changes a model's config before any server reads it. `repos.write_hubserve_repo` writes one
repository holding every (model, variant) as a model of its own, named by `Variant.served_name`; hubserve
serves it and `repos.py` generates each peer's repository from it, so every server gets the same change, and
one process per server serves all variants, measured point by point side by side. `model_repository/` is only
read. Pure: no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.proto import model_config_pb2 as pb


@dataclass(frozen=True, slots=True)
class Variant:
    """A change to some fields of a model's config; every field left None stays as in the example."""

    name: str
    max_batch_size: int | None = None
    max_queue_delay_us: int | None = None
    """Set: dynamic batching on, with this window (its other fields, e.g. preferred sizes, as in the
    example)."""

    @property
    def is_example(self) -> bool:
        """Whether this variant is the example's config itself (its file is served as it is)."""
        return self.max_batch_size is None and self.max_queue_delay_us is None

    def served_name(self, model: str) -> str:
        """The model's name under this variant: the example keeps its name, so its rows read as before."""
        return model if self.is_example else f"{model}_{self.name}"

    def apply(self, example: pb.ModelConfig, model: str) -> pb.ModelConfig:
        """The example's config (as parsed, before auto-complete) with this variant's fields set, named for
        it."""
        msg = pb.ModelConfig()
        msg.CopyFrom(example)
        msg.name = self.served_name(model)
        if self.max_batch_size is not None:
            msg.max_batch_size = self.max_batch_size
        if self.max_queue_delay_us is not None:
            msg.dynamic_batching.max_queue_delay_microseconds = self.max_queue_delay_us
        return msg

    def describe(self) -> str:
        if self.is_example:
            return "each model's config in model_repository/, as committed"
        changes = [f"max_batch_size: {self.max_batch_size}" if self.max_batch_size is not None else "",
                   f"dynamic_batching {{ max_queue_delay_microseconds: {self.max_queue_delay_us} }}"
                   if self.max_queue_delay_us is not None else ""]
        return f"the example's config with {', '.join(c for c in changes if c)}; everything else as in it"


EXAMPLES = Variant("examples")
TUNED = Variant("tuned", max_batch_size=64, max_queue_delay_us=1000)
VARIANTS = {v.name: v for v in (EXAMPLES, TUNED)}
