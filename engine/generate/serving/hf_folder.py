"""A Hugging Face model folder as its exporters write it → the generative config's `parameters`.

Two exports are recognised (`find_export`), their files at the model folder's top level (version 1 is the
folder's own files) or in `1/`:

    Optimum  (`optimum-cli export onnx --task text-generation-with-past`): model.onnx and config.json (a
             transformers config: its model_type, and a causal LM architecture or a generation_config.json),
             with generation_config.json, tokenizer.json, tokenizer_config.json as Optimum copies them
    genai    (onnxruntime-genai's model builder): genai_config.json and the model file it names (model.onnx),
             usually with the same Hugging Face files

What the engine needs is read from those files (`folder_parameters`), each value as a Triton-style string
under the parameter name model_folder.py reads, and where it came from under `source.<name>`:

    max_model_len               config.json: the least of max_position_embeddings, n_positions,
                                max_sequence_length, ... (as vLLM derives it); genai_config.json's
                                model.context_length
    kv_num_heads, kv_head_dim   config.json: num_key_value_heads (else num_attention_heads / n_head), head_dim
                                (else hidden_size / heads); genai_config.json's decoder num_key_value_heads
                                and head_size. The runner takes them where the graph leaves the past's dims
                                symbolic (a genai export) and checks them against fixed ones.
    past_present_share_buffer   genai_config.json's search.past_present_share_buffer
    tokenizer                   "tokenizer.json" when the folder has one
    bos_token, eos_token        tokenizer_config.json's (a string or an AddedToken's `content`)
    add_bos_token               tokenizer_config.json's (shown: tokenizer.json's post-processor adds the BOS)
    eos_token_ids               generation_config.json's eos_token_id (an id or a list), else config.json's,
                                else genai_config.json's: every one ends a generation (registry.py
                                `RequestDefaults`)
    bos_token_id                the same files' bos_token_id
    default_<field>             generation_config.json's temperature, top_p, top_k, min_p, repetition_penalty:
                                what a /v1 request that leaves the field out gets, as vLLM's
                                `--generation-config auto` (do_sample is not read, as vLLM does not); a
                                genai export without the file: its genai_config.json search section's, but
                                those equal to transformers' defaults (which the builder writes out)
    model_type                  config.json's, or genai_config.json's model.type (shown)

Precedence: a parameter the config (config.pbtxt, or a repository API override) sets wins over the folder's
value, which wins over model_folder.py's defaults; `source.<name>` then says "config (folder: ...)". Pure
reads of small JSON files, on the worker thread that reads the config.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import invalid
from ...proto import model_config_pb2 as pb

OPTIMUM = "optimum"
GENAI = "genai"

# config.json's keys for the context length, as vLLM reads them (the least of those present wins)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                "max_seq_length", "seq_len")
# generation_config.json's sampling defaults (vLLM's `--generation-config auto` reads the same)
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
SOURCE = "source."
OVERRIDDEN = "config (folder: "  # how `source.<name>` starts for a value the config sets over the folder's
# transformers' GenerationConfig defaults, which a saved generation_config.json leaves out (as vLLM reads
# it, through to_diff_dict) but genai_config.json's search section writes out
GENERATION_CONFIG_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "min_p": None,
                              "repetition_penalty": 1.0}


@dataclass(frozen=True, slots=True)
class Export:
    """A recognised export: which exporter's form, and the folder holding its files (the model folder, or
    its `1/`)."""

    form: str
    files: Path
    top_level: bool  # the files are the model folder's own: version 1 is the folder itself


def find_export(model_dir: Path) -> Export | None:
    """The export in `model_dir`'s own files, else in `1/`; None when neither holds one."""
    for files in (model_dir, model_dir / "1"):
        genai = files / "genai_config.json"
        if genai.is_file():
            if (files / _genai_filename(_read_json(genai, files, model_dir))).is_file():
                return Export(GENAI, files, files == model_dir)
        elif (files / "model.onnx").is_file() and _causal_lm(files, model_dir):
            return Export(OPTIMUM, files, files == model_dir)
    return None


def _causal_lm(files: Path, model_dir: Path) -> bool:
    """Whether `files` hold a transformers config.json of a model that generates text: a `model_type`, and a
    generation_config.json beside it or an architecture named for causal language modelling (an ONNX
    classifier beside its config.json is no export of ours)."""
    if not (files / "config.json").is_file():
        return False
    config = _read_json(files / "config.json", files, model_dir)
    if not isinstance(config.get("model_type"), str):
        return False
    architectures = config.get("architectures")
    causal = isinstance(architectures, list) and any(
        isinstance(a, str) and a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures)
    return causal or (files / "generation_config.json").is_file()


def folder_parameters(export: Export, model_dir: Path) -> dict[str, str]:
    """Every value the export's files give, by parameter name, and `source.<name>` for each (module doc)."""
    found: dict[str, tuple[Any, str]] = {}
    config = _optional_json(export.files / "config.json", model_dir)
    generation = _optional_json(export.files / "generation_config.json", model_dir)
    tokenizer = _optional_json(export.files / "tokenizer_config.json", model_dir)
    genai = _optional_json(export.files / "genai_config.json", model_dir)
    genai_model = _dict(genai.get("model"))
    decoder = _dict(genai_model.get("decoder"))

    contexts = [(config[k], f"config.json {k}") for k in CONTEXT_KEYS if _positive_int(config.get(k))]
    if contexts:
        found["max_model_len"] = min(contexts)
    elif _positive_int(genai_model.get("context_length")):
        found["max_model_len"] = (genai_model["context_length"], "genai_config.json model.context_length")

    heads, head_dim = _kv_shape(config, decoder)
    if heads is not None:
        found["kv_num_heads"] = heads
    if head_dim is not None:
        found["kv_head_dim"] = head_dim
    share = _dict(genai.get("search")).get("past_present_share_buffer")
    if isinstance(share, bool):
        found["past_present_share_buffer"] = (str(share).lower(),
                                              "genai_config.json search.past_present_share_buffer")

    if (export.files / "tokenizer.json").is_file():
        found["tokenizer"] = ("tokenizer.json", "tokenizer.json present")
    for name in ("bos_token", "eos_token"):
        token = _token_text(tokenizer.get(name))
        if token:
            found[name] = (token, f"tokenizer_config.json {name}")
    if isinstance(tokenizer.get("add_bos_token"), bool):
        found["add_bos_token"] = (str(tokenizer["add_bos_token"]).lower(),
                                  "tokenizer_config.json add_bos_token")
    for key, param in (("eos_token_id", "eos_token_ids"), ("bos_token_id", "bos_token_id")):
        for where, doc in (("generation_config.json", generation), ("config.json", config),
                           ("genai_config.json model.", genai_model)):
            ids = _token_ids(doc.get(key))
            if ids:
                found[param] = (",".join(map(str, ids)) if param == "eos_token_ids" else str(ids[0]),
                                f"{where}{'' if where.endswith('.') else ' '}{key}")
                break
    if generation:
        sampling, where = generation, "generation_config.json"
    else:  # the genai builder copies generation_config.json's into search, with transformers' defaults
        sampling, where = {k: v for k, v in _dict(genai.get("search")).items()
                           if GENERATION_CONFIG_DEFAULTS.get(k) != v}, "genai_config.json search."
    for key in SAMPLING_KEYS:
        value = sampling.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found[f"default_{key}"] = (value, f"{where}{'' if where.endswith('.') else ' '}{key}")
    model_type = config.get("model_type") or genai_model.get("type")
    if isinstance(model_type, str) and model_type:
        found["model_type"] = (model_type, "config.json model_type" if config.get("model_type")
                               else "genai_config.json model.type")

    out: dict[str, str] = {}
    for name, (value, source) in found.items():
        out[name], out[SOURCE + name] = str(value), source
    return out


def merge_parameters(configured: dict[str, str], folder: dict[str, str]) -> dict[str, str]:
    """The parameters to add to a config that sets `configured`: the folder's values it does not set, and a
    source for every folder value (for one the config overrides: "config (folder: <value> from <source>)")."""
    out: dict[str, str] = {}
    for name, value in folder.items():
        if name.startswith(SOURCE) or SOURCE + name in configured:
            continue
        source = folder[SOURCE + name]
        if name in configured:
            out[SOURCE + name] = f"{OVERRIDDEN}{value} from {source})"
        else:
            out[name], out[SOURCE + name] = value, source
    return out


def declare_export(msg: pb.ModelConfig, model_dir: Path) -> Export | None:
    """Make `msg` (the folder's config as read: empty without a config file) a generative config when the
    folder holds an export an ONNX Runtime model can be (module doc), in place: `generation`, the folder's
    parameters it does not set, `hf_export` (the form) and `hf_export_files` ("." or "1"), the backend, and a
    genai export's model file. None, and `msg` untouched, for any other folder. On a worker thread."""
    if msg.backend not in ("", "onnxruntime") or msg.platform not in ("", "onnxruntime_onnx"):
        return None
    export = find_export(model_dir)
    if export is None:
        return None
    files = "." if export.top_level else "1"
    where = "the folder's own files" if export.top_level else "1/"
    found = {"generation": "decoder_with_past", SOURCE + "generation": f"{export.form} export in {where}",
             "hf_export": export.form, SOURCE + "hf_export": f"{export.form} export in {where}",
             "hf_export_files": files, SOURCE + "hf_export_files": where,
             **folder_parameters(export, model_dir)}
    configured = {k: v.string_value for k, v in msg.parameters.items()}
    for name, value in merge_parameters(configured, found).items():
        msg.parameters[name].string_value = value
    if not msg.backend and not msg.platform:
        msg.backend = "onnxruntime"
    if export.form == GENAI and not msg.default_model_filename:
        msg.default_model_filename = _genai_filename(_read_json(export.files / "genai_config.json",
                                                                export.files, model_dir))
    return export


def export_files(parameters: Mapping[str, str], model_dir: Path) -> Path | None:
    """Where a declared export's files are (its tokenizer, tokenizer_config.json): the model folder or its
    `1/`; None for a folder that is no export."""
    files = parameters.get("hf_export_files")
    return None if files is None else model_dir if files == "." else model_dir / files


# ------------------------------------------------------------------------------------------ the files

def _read_json(path: Path, files: Path, model_dir: Path) -> dict[str, Any]:
    shown = f"{model_dir.name}/{path.relative_to(model_dir).as_posix()}" if path.is_relative_to(model_dir) \
        else path.name
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise invalid(f"{shown}: cannot be read as JSON: {e}") from None
    if not isinstance(doc, dict):
        raise invalid(f"{shown}: expected a JSON object")
    return doc


def _optional_json(path: Path, model_dir: Path) -> dict[str, Any]:
    return _read_json(path, path.parent, model_dir) if path.is_file() else {}


def _genai_filename(genai: dict[str, Any]) -> str:
    name = _dict(_dict(genai.get("model")).get("decoder")).get("filename")
    if isinstance(name, str) and name and "/" not in name and "\\" not in name and name not in (".", ".."):
        return name
    return "model.onnx"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: its text, or an AddedToken's `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _token_ids(value: Any) -> list[int]:
    """An id or a list of ids (generation_config.json's eos_token_id takes both); [] for anything else."""
    values = value if isinstance(value, list) else [value]
    ids = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    return list(dict.fromkeys(ids)) if len(ids) == len(values) else []


def _kv_shape(config: dict[str, Any], decoder: dict[str, Any]
              ) -> tuple[tuple[int, str] | None, tuple[int, str] | None]:
    """(KV heads, head size), each with its source: genai_config.json's decoder first (it describes the
    graph), then config.json."""
    heads: tuple[int, str] | None = None
    head_dim: tuple[int, str] | None = None
    for key in ("num_key_value_heads", "num_attention_heads"):
        if _positive_int(decoder.get(key)):
            heads = (decoder[key], f"genai_config.json model.decoder.{key}")
            break
    if _positive_int(decoder.get("head_size")):
        head_dim = (decoder["head_size"], "genai_config.json model.decoder.head_size")
    attention = next((k for k in ("num_attention_heads", "n_head") if _positive_int(config.get(k))), None)
    kv_key = "num_key_value_heads" if _positive_int(config.get("num_key_value_heads")) else attention
    if heads is None and kv_key is not None:
        heads = (config[kv_key], f"config.json {kv_key}")
    if head_dim is None:
        hidden = next((k for k in ("hidden_size", "n_embd") if _positive_int(config.get(k))), None)
        if _positive_int(config.get("head_dim")):
            head_dim = (config["head_dim"], "config.json head_dim")
        elif attention is not None and hidden is not None and config[hidden] % config[attention] == 0:
            head_dim = (config[hidden] // config[attention], f"config.json {hidden} / {attention}")
    return heads, head_dim
