"""Model repositories for the peer servers, generated from hubserve's own model configs.

Run with hubserve's venv (it reads the configs through `engine.config.steps`, so every peer gets the batching
settings hubserve actually uses, after auto-complete):

    .venv/bin/python perf/peers/repos.py triton   --site-packages .peers/triton/lib/python3.11/site-packages
    .venv/bin/python perf/peers/repos.py triton-ort
    .venv/bin/python perf/peers/repos.py kserve
    .venv/bin/python perf/peers/repos.py mlserver

Called by the setup scripts and again by `bench_peers.py` before every run, so the peers never drift from
`model_repository/`. `bench_peers.py` first writes `.peers/hubserve_repo/` (`write_hubserve_repo`: each model
once per config variant, `variants.py`), which hubserve serves, and generates the peers' repositories from
that. Writes only under `.peers/` (gitignored). Every peer repository holds a copy of the same `model.onnx`
hubserve serves.

- Triton: `<model>/config.pbtxt` (backend "python", same max_batch_size, dynamic_batching and instance count;
  a sequence model's `sequence_batching` with its strategy, control inputs and state, which `triton_model.py`
  feeds to the model) and `<model>/1/{model.py,model.onnx,site-packages.txt}`. Triton's Python backend does
  not carry implicit state (the state input arrives as the initial state on every request: the state output
  is not kept), so only a sequence model without `state` behaves the same there (perf/bench_sequence.py
  checks it).
- Triton with its C++ onnxruntime backend (`setup_triton_ort.sh`): `<model>/config.pbtxt` (backend
  "onnxruntime", the same fields as above) and `<model>/1/model.onnx`; ONNX Runtime's threads are set on the
  server's command line (`servers.TRITON_ORT`), not per model.
- KServe: `<model>/{model.onnx,spec.json}`; `spec.json` is read by `kserve_model.py`.
- MLServer: `settings.json`, `<model>/{model.onnx,model-settings.json,spec.json}`; adaptive batching gets
  `max_batch_size` and `max_batch_time` = hubserve's `max_queue_delay_microseconds` (MLServer only batches
  when that time is > 0, so a zero delay becomes `MLSERVER_MIN_BATCH_TIME_S`).

`spec.json` also carries the model config that perf_analyzer reads before it starts (KServe and MLServer have
no model-config endpoint; `triton_config_shim.py` serves this one), described as the peer really runs it.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import text_format

from engine import backends
from engine.config.json_form import message_to_json
from engine.config.model_config import ModelConfig
from engine.config.sequence import ControlKind, SequenceBatchingConfig, Strategy
from engine.config.steps import (
    CONFIG_FILES,
    autocomplete,
    backend_of,
    default_filename,
    read_config_proto,
    validate,
)
from engine.proto import grpc_service_pb2
from engine.proto import model_config_pb2 as pb
from engine.types import DataType

if TYPE_CHECKING:  # this file also runs as a script, with perf/peers/ (not perf/) on sys.path
    from peers.variants import Variant

ROOT = Path(__file__).resolve().parents[2]

PEERS_DIR = ROOT / ".peers"
DEFAULT_MODELS = ("simple", "mlp", "image")
TRITON_MODEL_PY = Path(__file__).resolve().parent / "triton_model.py"
MLSERVER_MIN_BATCH_TIME_S = 0.0001


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One model as hubserve serves it: its completed config and its ONNX file."""

    config: ModelConfig
    onnx_path: Path

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def max_queue_delay_us(self) -> int:
        return self.config.dynamic_batching.max_queue_delay_us if self.config.dynamic_batching else 0

    @property
    def instance_count(self) -> int:
        return sum(g.count for g in self.config.instance_groups)


def served_model(repository: Path, name: str) -> ServedModel:
    """Parse → auto-complete → validate, the steps hubserve's repository takes for one model (latest
    version)."""
    model_dir = repository / name
    where = f"model '{name}'"
    msg = read_config_proto(model_dir)
    backend = backend_of(msg, where) or "onnxruntime"
    msg.backend = msg.backend or backend
    versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        raise SystemExit(f"{model_dir}: no version folder; "
                         f"run `.venv/bin/python -m hubserve_models.examples {repository}`")
    path = model_dir / str(versions[-1]) / (msg.default_model_filename or default_filename(backend))
    if not path.is_file():
        raise SystemExit(f"{path} is missing; "
                         f"run `.venv/bin/python -m hubserve_models.examples {repository}`")
    autocomplete(msg, backends.describe(backend, path), name)
    return ServedModel(validate(msg, where), path)


def peer_config(model: ServedModel, backend: str, batching: bool) -> pb.ModelConfig:
    """The Triton-style config of the model as a peer runs it (what perf_analyzer is shown)."""
    cfg = model.config
    msg = pb.ModelConfig(name=cfg.name, backend=backend, max_batch_size=cfg.max_batch_size)
    for specs, field in ((cfg.inputs, msg.input), (cfg.outputs, msg.output)):
        for spec in specs:
            field.add(name=spec.name, data_type=pb.DataType.Value(_type_name(spec.datatype)),
                      dims=list(spec.dims))
    if batching and cfg.dynamic_batching is not None:
        msg.dynamic_batching.max_queue_delay_microseconds = cfg.dynamic_batching.max_queue_delay_us
        msg.dynamic_batching.preferred_batch_size.extend(cfg.dynamic_batching.preferred_batch_sizes)
    if cfg.sequence_batching is not None:  # not optional: a sequence model cannot run without it
        _sequence_batching(cfg.sequence_batching, msg.sequence_batching)
    msg.instance_group.add(count=model.instance_count, kind=pb.ModelInstanceGroup.KIND_CPU)
    return msg


def _sequence_batching(sb: SequenceBatchingConfig, out: pb.ModelSequenceBatching) -> None:
    """`sequence_batching` as hubserve runs it (strategy, idle limit, control inputs, implicit state), so
    the peer's sequence batcher feeds the same model the same tensors."""
    out.max_sequence_idle_microseconds = sb.max_sequence_idle_us
    if sb.strategy is Strategy.OLDEST:
        out.oldest.max_candidate_sequences = sb.max_candidate_sequences
        out.oldest.max_queue_delay_microseconds = sb.max_queue_delay_us
        out.oldest.preferred_batch_size.extend(sb.preferred_batch_sizes)
        out.oldest.preserve_ordering = sb.preserve_ordering
    else:
        out.direct.max_queue_delay_microseconds = sb.max_queue_delay_us
        out.direct.minimum_slot_utilization = sb.minimum_slot_utilization
    for control in sb.controls:
        kind = pb.ModelSequenceBatching.Control.Kind.Value(control.kind.value)
        corrid = control.kind is ControlKind.CORRID  # the correlation id's control has a type, no values
        c = out.control_input.add(name=control.name).control.add(
            kind=kind, data_type=_type_name(control.datatype) if corrid else None)
        if corrid:
            continue
        if control.datatype is DataType.FP32:
            c.fp32_false_true.extend(control.false_true)
        elif control.datatype is DataType.BOOL:
            c.bool_false_true.extend(control.false_true)
        else:
            c.int32_false_true.extend(control.false_true)
    for state in sb.states:
        if state.initial.any():
            raise SystemExit(f"state '{state.input_name}': a non-zero initial_state is not carried to the "
                             "peers yet")
        s = out.state.add(input_name=state.input_name, output_name=state.output_name,
                          data_type=pb.DataType.Value(_type_name(state.datatype)), dims=list(state.dims))
        # hubserve starts a state at zeros; Triton without an initial_state leaves it uninitialised.
        s.initial_state.add(data_type=s.data_type, dims=list(state.dims), zero_data=True, name="zeros")


def _type_name(datatype: DataType) -> str:
    return "TYPE_STRING" if datatype is DataType.BYTES else f"TYPE_{datatype.value}"


def _copy_if_changed(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists() or dst.read_bytes() != src.read_bytes():
        shutil.copyfile(src, dst)


def _remove_stale(dst: Path, keep: set[str], marker: str) -> None:
    """Drop model folders this script wrote earlier (they hold `marker`, a glob) for models no longer asked
    for (a server loads them all)."""
    for folder in dst.glob("*/"):
        if folder.name not in keep and any(folder.glob(marker)):
            shutil.rmtree(folder)


def write_hubserve_repo(source: Path, models: list[str], chosen: list[Variant], dst: Path) -> list[str]:
    """Write `dst`, the repository hubserve serves in the benchmark and the peers' repositories are generated
    from: each model of `source` once per variant in `chosen`, as `<served name>/` with the variant's config
    (the example's file copied as it is, or the example's config with the variant's fields set, as
    config.pbtxt) and a copy of the example's latest model file. `source` is only read. Returns the served
    names, variant by variant within each model."""
    names = []
    for model in models:
        example_dir = source / model
        model_file = served_model(source, model).onnx_path  # the example itself must load
        example_file = next((f for f in CONFIG_FILES if (example_dir / f).is_file()), None)
        for variant in chosen:
            folder = dst / variant.served_name(model)
            folder.mkdir(parents=True, exist_ok=True)
            config_file = example_file if variant.is_example else "config.pbtxt"
            for other in CONFIG_FILES:  # hubserve reads the first it finds
                if other != config_file:
                    (folder / other).unlink(missing_ok=True)
            if variant.is_example and example_file is not None:
                _copy_if_changed(example_dir / example_file, folder / example_file)
            elif not variant.is_example:
                config = variant.apply(read_config_proto(example_dir), model)
                (folder / "config.pbtxt").write_text(text_format.MessageToString(config))
            _copy_if_changed(model_file, folder / model_file.parent.name / model_file.name)
            names.append(folder.name)
    _remove_stale(dst, set(names), "*/model.onnx")
    return names


def _tensor_metadata(model: ServedModel) -> tuple[list[dict], list[dict]]:
    batch = [-1] if model.config.max_batch_size > 0 else []
    describe = [[{"name": s.name, "datatype": s.datatype.value, "shape": batch + list(s.dims)} for s in specs]
                for specs in (model.config.inputs, model.config.outputs)]
    return describe[0], describe[1]


def _spec(model: ServedModel, backend: str, batching: bool) -> dict:
    """What kserve_model.py / mlserver_runtime.py / triton_config_shim.py read (they cannot import engine)."""
    config = peer_config(model, backend, batching)
    inputs, outputs = _tensor_metadata(model)
    response = grpc_service_pb2.ModelConfigResponse()
    response.config.ParseFromString(config.SerializeToString())
    return {
        "name": model.name,
        "max_batch_size": model.config.max_batch_size,
        "inputs": inputs,
        "outputs": outputs,
        "triton_config": message_to_json(config),
        "triton_config_response_b64": base64.b64encode(response.SerializeToString()).decode(),
    }


def write_triton_repo(models: list[ServedModel], dst: Path, site_packages: Path) -> None:
    _remove_stale(dst, {m.name for m in models}, "1/site-packages.txt")
    for model in models:
        version_dir = dst / model.name / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        config = peer_config(model, "python", batching=True)
        (dst / model.name / "config.pbtxt").write_text(text_format.MessageToString(config))
        _copy_if_changed(TRITON_MODEL_PY, version_dir / "model.py")
        _copy_if_changed(model.onnx_path, version_dir / "model.onnx")
        (version_dir / "site-packages.txt").write_text(f"{site_packages.resolve()}\n")


def write_triton_ort_repo(models: list[ServedModel], dst: Path) -> None:
    """The repository Triton's C++ onnxruntime backend serves: the same config fields as the stand-in's, so
    both Triton rows batch alike, and the model file itself."""
    _remove_stale(dst, {m.name for m in models}, "1/model.onnx")
    for model in models:
        config = peer_config(model, "onnxruntime", batching=True)
        (dst / model.name).mkdir(parents=True, exist_ok=True)
        (dst / model.name / "config.pbtxt").write_text(text_format.MessageToString(config))
        _copy_if_changed(model.onnx_path, dst / model.name / "1" / "model.onnx")


def mlserver_batching(model: ServedModel) -> tuple[int, float] | None:
    """MLServer's adaptive batching for the model, (max_batch_size, max_batch_time in s), or None for none:
    hubserve's settings, but MLServer only batches when the time is > 0."""
    if model.config.max_batch_size > 1 and model.config.dynamic_batching is not None:
        return model.config.max_batch_size, max(model.max_queue_delay_us / 1e6, MLSERVER_MIN_BATCH_TIME_S)
    return None


def write_kserve_repo(models: list[ServedModel], dst: Path) -> None:
    _remove_stale(dst, {m.name for m in models}, "spec.json")
    for model in models:
        _copy_if_changed(model.onnx_path, dst / model.name / "model.onnx")
        # KServe's python model server has no server-side batcher: each request runs alone.
        spec = _spec(model, "kserve", batching=False)
        (dst / model.name / "spec.json").write_text(json.dumps(spec, indent=1))


def write_mlserver_repo(models: list[ServedModel], dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    _remove_stale(dst, {m.name for m in models}, "spec.json")
    # debug=false: no per-request access log (MLServer's default is debug=true). One inference worker process
    # (MLServer's default parallel_workers), matching hubserve's single instance.
    (dst / "settings.json").write_text(json.dumps({"debug": False, "parallel_workers": 1}, indent=1))
    for model in models:
        folder = dst / model.name
        _copy_if_changed(model.onnx_path, folder / "model.onnx")
        inputs, outputs = _tensor_metadata(model)
        settings: dict[str, Any] = {
            "name": model.name,
            "implementation": "mlserver_runtime.OnnxRuntimeModel",
            "parameters": {"uri": "./model.onnx"},
            "inputs": [{"name": t["name"], "datatype": t["datatype"], "shape": t["shape"]} for t in inputs],
            "outputs": [{"name": t["name"], "datatype": t["datatype"], "shape": t["shape"]} for t in outputs],
        }
        batching = mlserver_batching(model)
        if batching is not None:
            settings["max_batch_size"], settings["max_batch_time"] = batching
        (folder / "model-settings.json").write_text(json.dumps(settings, indent=1))
        (folder / "spec.json").write_text(json.dumps(_spec(model, "mlserver", batching=True), indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peer", choices=("triton", "triton-ort", "kserve", "mlserver"))
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--out", type=Path, help="default: .peers/<peer>_repo")
    parser.add_argument("--site-packages", type=Path, help="triton: the peer venv's site-packages")
    args = parser.parse_args(argv)
    models = [served_model(args.repository, name) for name in args.models.split(",") if name]
    out = args.out or PEERS_DIR / f"{args.peer.replace('-', '_')}_repo"
    if args.peer == "triton":
        if args.site_packages is None:
            parser.error("triton needs --site-packages (the peer venv's site-packages)")
        write_triton_repo(models, out, args.site_packages)
    elif args.peer == "triton-ort":
        write_triton_ort_repo(models, out)
    elif args.peer == "kserve":
        write_kserve_repo(models, out)
    else:
        write_mlserver_repo(models, out)
    print(f"{args.peer} repository: {out} ({', '.join(m.name for m in models)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
