"""The two exporters, run on a saved Hugging Face folder: Optimum's and onnxruntime-genai's model builder.

Called by make_fixtures.py with the source folder (weights as safetensors, config, generation config,
tokenizer) and an empty output folder; each writes the folder as its exporter does, with the weights folded
into model.onnx so that no external-data file has to be committed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx


def optimum_export(source: Path, output: Path) -> None:
    """`optimum-cli export onnx --task text-generation-with-past`: the merged decoder with past, fp32."""
    from optimum.exporters.onnx import main_export

    main_export(
        model_name_or_path=str(source),
        output=str(output),
        task="text-generation-with-past",
        device="cpu",
        do_validation=False,
    )
    fold_external_data(output / "model.onnx")


def genai_export(source: Path, output: Path, cache: Path) -> None:
    """onnxruntime-genai's model builder, fp32 for the CPU, with its genai_config.json."""
    command = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(source),
        "-o",
        str(output),
        "-p",
        "fp32",
        "-e",
        "cpu",
        "-c",
        str(cache),
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    fold_external_data(output / "model.onnx")


def fold_external_data(model_path: Path) -> None:
    """Rewrite `model_path` with every initializer inside it, and remove the external-data files it used."""
    proto = onnx.load(str(model_path), load_external_data=False)
    locations = {
        entry.value
        for init in proto.graph.initializer
        for entry in init.external_data
        if entry.key == "location"
    }
    if not locations:
        return
    model = onnx.load(str(model_path), load_external_data=True)
    for init in model.graph.initializer:
        init.data_location = onnx.TensorProto.DEFAULT
        del init.external_data[:]
    onnx.save_model(model, str(model_path), save_as_external_data=False)
    for location in locations:
        (model_path.parent / location).unlink()


def template_into_tokenizer_config(folder: Path) -> None:
    """Move chat_template.jinja into tokenizer_config.json's `chat_template`, the form older exports have."""
    template_path = folder / "chat_template.jinja"
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = template_path.read_text(encoding="utf-8")
    # As transformers writes the file: sorted keys, two-space indent, UTF-8 as it is.
    config_path.write_text(
        json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    template_path.unlink()
