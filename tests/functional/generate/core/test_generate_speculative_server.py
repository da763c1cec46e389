"""Speculative decoding behind a real server: a model folder with `speculative_method` "ngram" answers the
`openai` client with exactly the text the same model without it gives (greedy; streamed and with several
prompts in one request), and its /metrics page counts the proposed and kept tokens under our names and
vLLM's, which the folder without speculation does not show. The engine's side is in
tests/unit/generate/core/test_generate_speculative.py."""

from __future__ import annotations

import shutil
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import EXAMPLES, openai_client, start_server
from hubserve_models import examples

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
REPETITIVE = "the cat sat on the mat; the cat sat on the mat; the cat sat on the"


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_speculating_folder_answers_alike_and_counts_its_proposals(
        tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("speculative") / "repo"
    (root / "tiny_decoder").mkdir(parents=True)
    config = (EXAMPLES / "tiny_decoder" / "config.pbtxt").read_text()
    shutil.copy(EXAMPLES / "tiny_decoder" / "config.pbtxt", root / "tiny_decoder" / "config.pbtxt")
    examples.build_repository(root, ["tiny_decoder"])
    (root / "tiny_spec" / "1").mkdir(parents=True)
    (root / "tiny_spec" / "config.pbtxt").write_text(
        config.replace('name: "tiny_decoder"', 'name: "tiny_spec"')
        + 'parameters { key: "speculative_method" value { string_value: "ngram" } }\n'
        + 'parameters { key: "num_speculative_tokens" value { string_value: "3" } }\n')
    shutil.copy(root / "tiny_decoder" / "1" / "model.onnx", root / "tiny_spec" / "1" / "model.onnx")
    server = start_server(root, tmp_path_factory.mktemp("speculative_log") / "server.log")
    try:
        client = openai_client(server)
        texts = {}
        for model in ("tiny_decoder", "tiny_spec"):
            chunks = client.completions.create(model=model, prompt=REPETITIVE, max_tokens=48, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
            texts[model] = "".join(c.choices[0].text for c in chunks if c.choices)
            several = client.completions.create(model=model, prompt=[REPETITIVE, "abcabcabcabc", "x"],
                                                max_tokens=32, temperature=0, extra_body={"ignore_eos": True})
            texts[model + " batch"] = [c.text for c in sorted(several.choices, key=lambda c: c.index)]
        assert texts["tiny_decoder"] and texts["tiny_decoder"] == texts["tiny_spec"]
        assert texts["tiny_decoder batch"] == texts["tiny_spec batch"]
        page = scrape(server.metrics_url)
        spec = (("engine", "1"), ("model_name", "tiny_spec"))
        drafted = page[("vllm:spec_decode_num_draft_tokens_total", spec)]
        kept = page[("vllm:spec_decode_num_accepted_tokens_total", spec)]
        assert drafted > 0 and 0 <= kept <= drafted
        ours = (("model", "tiny_spec"), ("version", "1"))
        assert page[("hubserve_generation_spec_draft_tokens_total", ours)] == drafted
        assert page[("hubserve_generation_spec_accepted_tokens_total", ours)] == kept
        plain = (("engine", "1"), ("model_name", "tiny_decoder"))
        assert ("vllm:spec_decode_num_draft_tokens_total", plain) not in page
    finally:
        server.stop()
