"""The config step for `platform: "ensemble"`: check what an ensemble's own config can get wrong, then freeze
it. Called by `config.validate` for a config with that platform (or with `ensemble_scheduling`).

Only what the config alone decides is checked here, in Triton's words (core model_config_utils.cc
ValidateEnsembleSchedulingConfig): the platform, the fields an ensemble may not have, every step named and
mapped, and the data flow (engine/scheduling/ensemble/plan.py `check_data_flow`). What needs the composing
models (their tensors, datatypes, shapes, batch sizes) is checked when the ensemble loads
(`EnsemblePlan.build`).
"""

from __future__ import annotations

from ..errors import invalid
from ..proto import model_config_pb2 as pb
from ..scheduling.ensemble.plan import check_data_flow
from .model_config import ENSEMBLE_PLATFORM, EnsembleScheduling, EnsembleStep, ModelConfig
from .steps import tensor_specs, version_policy_of


def validate_ensemble(msg: pb.ModelConfig, where: str) -> ModelConfig:
    """The completed config of an ensemble, frozen; INVALID_ARG naming the model and the field."""
    name = msg.name
    if msg.platform != ENSEMBLE_PLATFORM:
        raise invalid(f"{where}: ensemble scheduling cannot be set for model '{name}' whose platform is not "
                      f"{ENSEMBLE_PLATFORM}")
    if not msg.HasField("ensemble_scheduling"):
        raise invalid(f"{where}: ensemble scheduling must be set for ensemble '{name}' whose platform is "
                      f"{ENSEMBLE_PLATFORM}")
    if msg.backend:
        raise invalid(f"{where}: ensemble '{name}' has backend '{msg.backend}'; an ensemble has none")
    for present, what in ((len(msg.instance_group) != 0, "instance group should not be specified"),
                          (msg.HasField("optimization"), "optimization should not be specified"),
                          (len(msg.model_warmup) != 0, "model_warmup can not be specified")):
        if present:
            raise invalid(f"{where}: {what} for ensemble '{name}'")
    inputs, outputs = tensor_specs(msg, where, "ensemble")
    scheduling = msg.ensemble_scheduling
    if not scheduling.step:
        raise invalid(f"{where}: must specify 'step' for ensemble '{name}'")
    steps = []
    for index, step in enumerate(scheduling.step):
        for missing, field in ((not step.model_name, "model_name"), (not step.input_map, "input_map"),
                               (not step.output_map, "output_map")):
            if missing:
                raise invalid(f"{where}: must specify '{field}' in step {index} of ensemble '{name}'")
        if step.model_namespace:
            raise invalid(f"{where}: step {index} of ensemble '{name}' sets model_namespace; hubserve has "
                          "one namespace, so leave it out")
        version = int(step.model_version) if step.model_version else -1
        steps.append(EnsembleStep(step.model_name, version, tuple(sorted(step.input_map.items())),
                                  tuple(sorted(step.output_map.items()))))
    ensemble = EnsembleScheduling(tuple(steps), int(scheduling.max_inflight_requests))
    check_data_flow(name, tuple(s.name for s in inputs), tuple(s.name for s in outputs), ensemble.steps)
    return ModelConfig(
        name=name,
        backend=ENSEMBLE_PLATFORM,
        platform=ENSEMBLE_PLATFORM,
        max_batch_size=msg.max_batch_size,
        inputs=inputs,
        outputs=outputs,
        instance_groups=(),
        dynamic_batching=None,
        version_policy=version_policy_of(msg),
        default_model_filename="",
        parameters={k: v.string_value for k, v in msg.parameters.items()},
        proto_bytes=msg.SerializeToString(deterministic=True),
        ensemble=ensemble,
    )
