"""Build the LLM fixture folders under tests/fixtures/llm from the real exporters (see README.md beside this).

Run in the fixture venv, never the project's:
    /work/fixvenv/bin/python tools/llm_fixtures/make_fixtures.py --out tests/fixtures/llm

For each family in fixture_families.FAMILIES: train its tokenizer, build the tiny random-weight model (the
first seed whose greedy steps all have a clear top-1/top-2 gap, preferring one where some case stops on an EOS
token and, for SentencePiece, one whose first generated word shows the leading space), save it as a Hugging
Face folder, export it with Optimum into models/<name>/, check that onnxruntime on the export gives
transformers' tokens, and write expected/<name>.json. The Llama-3-style model is also exported with
onnxruntime-genai's builder into models/llama_genai/ and checked with its Generator.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import fixture_expected as fe
import fixture_export as fx
import fixture_families as ff
import fixture_tokenizers as ft
import onnxruntime
import optimum.version
import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

REPO_ROOT = Path(__file__).resolve().parents[2]
GENAI_FROM = "llama"  # the family also exported with onnxruntime-genai's builder


def _versions() -> dict[str, str]:
    import onnxruntime_genai

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "optimum": optimum.version.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_genai": onnxruntime_genai.__version__,
    }


def _build_model(family: ff.Family, tok: PreTrainedTokenizerFast, seed: int) -> Any:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family.make_config(tok), dtype=torch.float32)
    return model.eval()


def _wanted(
    family: ff.Family, tok: PreTrainedTokenizerFast, generation: dict[str, Any], all_cases: list[fe.Case]
) -> int:
    """A score for the behaviours worth recording: a stop before max_new_tokens on an EOS id that only
    generation_config.json's list names (2), or on any EOS id (1); plus 1 for a first generated word whose
    leading space shows only when decoded after the prompt (SentencePiece)."""
    config_eos = family.make_config(tok).eos_token_id
    named_elsewhere = set(config_eos if isinstance(config_eos, list) else [config_eos]) | {tok.eos_token_id}
    list_only = set(fe.eos_list(generation)) - named_elsewhere
    records = [c.record for c in all_cases if "output_ids" in c.record]
    early = [
        r for r in records if r["finish_reason"] == "stop" and len(r["output_ids"]) < family.max_new_tokens
    ]
    stop_score = 2 if any(r["stop_token_id"] in list_only for r in early) else int(bool(early))
    leading_space = any(
        r["text"] is not None and r["text"] == " " + r["text_alone"] and not r["text_alone"].startswith(" ")
        for r in records
    )
    return stop_score + int(leading_space)


def _choose_model(
    family: ff.Family, tok: PreTrainedTokenizerFast, generation: dict[str, Any], corpus: list[str]
) -> tuple[int, Any, list[fe.Case], float]:
    """Among the seeds whose every greedy step is clear, the first with the highest `_wanted()` score."""
    best: tuple[int, Any, list[fe.Case], float] | None = None
    best_score = -1
    for seed in family.seeds:
        model = _build_model(family, tok, seed)
        all_cases = fe.cases(family, tok, corpus)
        gap = fe.torch_greedy(model, tok, family, generation, all_cases)
        if gap <= fe.MIN_TOP2_GAP:
            continue
        score = _wanted(family, tok, generation, all_cases)
        if score > best_score:
            best, best_score = (seed, model, all_cases, gap), score
    if best is None:
        raise SystemExit(
            f"{family.name}: no seed in {family.seeds} gives top-1/top-2 gaps above {fe.MIN_TOP2_GAP}"
        )
    return best


def _save_source(
    family: ff.Family, tok: PreTrainedTokenizerFast, model: Any, generation: dict[str, Any], source: Path
) -> None:
    model.save_pretrained(source)
    GenerationConfig(**generation).save_pretrained(source)
    tok.save_pretrained(source)


def _check_onnx(
    family: ff.Family, folder: Path, generation: dict[str, Any], all_cases: list[fe.Case]
) -> list[str]:
    """Greedy onnxruntime on the export for every generated case; the mismatches, described."""
    eos = fe.eos_list(generation)
    penalty = float(generation.get("repetition_penalty", 1.0))
    mismatches = []
    for case in all_cases:
        if not case.generate or case.prompt_ids is None:
            continue
        got = fe.onnx_greedy(folder / "model.onnx", case.prompt_ids, family.max_new_tokens, eos, penalty)
        if got != case.record["output_ids"]:
            mismatches.append(
                f"{family.name} {case.kind} {case.name}: onnx {got} != torch {case.record['output_ids']}"
            )
    return mismatches


def _check_genai(family: ff.Family, folder: Path, all_cases: list[fe.Case]) -> dict[str, Any]:
    """onnxruntime-genai's Generator on the builder export: its tokens where they differ from torch's."""
    differing: dict[str, list[int]] = {}
    for case in all_cases:
        if not case.generate or case.prompt_ids is None:
            continue
        got = fe.genai_greedy(folder, case.prompt_ids, family.max_new_tokens)
        want = case.record["output_ids"]
        # The Generator's sequence ends before the EOS token that stopped it; generate()'s includes it.
        if case.record["finish_reason"] == "stop":
            want = want[:-1]
        if got != want:
            differing[f"{case.kind}:{case.name}"] = got
    return {
        "all_match": not differing,
        "note": "the Generator's sequence leaves out the EOS token that stopped it; compared without it",
        "differing_output_ids": differing,
    }


def _expected(
    family: ff.Family,
    seed: int,
    gap: float,
    generation: dict[str, Any],
    all_cases: list[fe.Case],
    exporter: str,
    extra: dict[str, Any],
) -> dict[str, Any]:
    tool_chats = [c.record for c in all_cases if c.kind == "tool_chat"]
    return {
        "model": family.name,
        "exporter": exporter,
        "versions": _versions(),
        "seed": seed,
        "context_length": family.context_length,
        "greedy": {
            "do_sample": False,
            "max_new_tokens": family.max_new_tokens,
            "eos_token_id": fe.eos_list(generation),
            "repetition_penalty": float(generation.get("repetition_penalty", 1.0)),
        },
        "min_top2_gap": float(f"{gap:.3g}"),
        **extra,
        "prompts": [c.record for c in all_cases if c.kind == "prompt"],
        "chats": [c.record for c in all_cases if c.kind == "chat"],
        **({"tool_chats": tool_chats} if tool_chats else {}),
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def build_family(family: ff.Family, out: Path, corpus: list[str], work: Path) -> list[str]:
    """Build, export, check and record one family; return the mismatches found (empty when all agree)."""
    tok = family.make_tokenizer(corpus, family.tokenizer_vocab)
    tok.chat_template = family.chat_template
    generation = family.generation_config(tok)
    seed, model, all_cases, gap = _choose_model(family, tok, generation, corpus)
    print(f"{family.name}: seed {seed}, vocab {len(tok)}, least top-2 gap {gap:.3g}", flush=True)
    source = work / f"{family.name}_hf"
    _save_source(family, tok, model, generation, source)

    folder = out / "models" / family.name
    shutil.rmtree(folder, ignore_errors=True)
    fx.optimum_export(source, folder)
    if family.template_in_tokenizer_config:
        fx.template_into_tokenizer_config(folder)
    mismatches = _check_onnx(family, folder, generation, all_cases)
    extra = {"onnxruntime_matches_torch": not mismatches}
    _write_json(
        out / "expected" / f"{family.name}.json",
        _expected(family, seed, gap, generation, all_cases, "optimum text-generation-with-past", extra),
    )

    if family.name == GENAI_FROM:
        genai_folder = out / "models" / f"{family.name}_genai"
        shutil.rmtree(genai_folder, ignore_errors=True)
        fx.genai_export(source, genai_folder, work / "genai_cache")
        genai = _check_genai(family, genai_folder, all_cases)
        if not genai["all_match"]:
            mismatches.append(f"{family.name}_genai: {genai['differing_output_ids']}")
        _write_json(
            out / "expected" / f"{family.name}_genai.json",
            _expected(
                family,
                seed,
                gap,
                generation,
                all_cases,
                "onnxruntime-genai builder fp32 cpu",
                {"onnxruntime_genai": genai},
            ),
        )
    return mismatches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the fixture folder, e.g. tests/fixtures/llm")
    parser.add_argument("--only", nargs="*", default=None, help="family names to build (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    corpus = ft.corpus_lines(REPO_ROOT)
    mismatches: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in ff.FAMILIES:
            if args.only is None or family.name in args.only:
                mismatches += build_family(family, args.out, corpus, Path(tmp))
    for line in mismatches:
        print("MISMATCH", line, file=sys.stderr)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
