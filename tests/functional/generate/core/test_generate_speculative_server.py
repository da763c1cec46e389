"""Speculative decoding behind a real server: a model folder with `speculative_method` "ngram" answers the
`openai` client with exactly the text the same model without it gives (greedy; streamed and with several
prompts in one request), and its /metrics page counts the proposed and kept tokens under our names and
vLLM's, which the folder without speculation does not show; a folder whose draft model never agrees
(the tiny decoder with other weights) backs off, and the page shows it. The engine's side is in
tests/unit/generate/core/test_generate_speculative.py and test_generate_backoff.py."""

from __future__ import annotations

import shutil
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import EXAMPLES, RunningServer, openai_client, start_server
from hubserve_models import examples
from hubserve_models.tiny_decoder import tiny_decoder_model

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
REPETITIVE = "the cat sat on the mat; the cat sat on the mat; the cat sat on the"


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """tiny_decoder; tiny_spec, the same with n-gram lookup; tiny_draft, the same with a draft that never
    agrees (the tiny decoder with other weights), behind the back-off the folder's loader applies."""
    root = tmp_path_factory.mktemp("speculative") / "repo"
    (root / "tiny_decoder").mkdir(parents=True)
    config = (EXAMPLES / "tiny_decoder" / "config.pbtxt").read_text()
    shutil.copy(EXAMPLES / "tiny_decoder" / "config.pbtxt", root / "tiny_decoder" / "config.pbtxt")
    examples.build_repository(root, ["tiny_decoder"])
    spec = ('parameters { key: "speculative_method" value { string_value: "ngram" } }\n'
            'parameters { key: "num_speculative_tokens" value { string_value: "3" } }\n')
    draft = ('parameters { key: "speculative_method" value { string_value: "draft_model" } }\n'
             'parameters { key: "speculative_model" value { string_value: "draft.onnx" } }\n')
    for name, params in (("tiny_spec", spec), ("tiny_draft", draft)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(
            config.replace('name: "tiny_decoder"', f'name: "{name}"') + params)
        shutil.copy(root / "tiny_decoder" / "1" / "model.onnx", root / name / "1" / "model.onnx")
    (root / "tiny_draft" / "draft.onnx").write_bytes(examples.model_bytes(tiny_decoder_model(seed=5)))
    running = start_server(root, tmp_path_factory.mktemp("speculative_log") / "server.log")
    try:
        yield running
    finally:
        running.stop()


def test_a_speculating_folder_answers_alike_and_counts_its_proposals(server: RunningServer) -> None:
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


def test_a_draft_that_never_agrees_backs_off_and_the_metrics_say_so(server: RunningServer) -> None:
    """The back-off's state beside the spec families: back-offs started (at least one: 48 tokens of 0 %
    acceptance) and the requests backing off now (none: the request has finished). The folder without
    speculation, and the n-gram one (it backs off too), are checked for the families' presence only."""
    client = openai_client(server)
    texts = [client.completions.create(model=model, prompt=REPETITIVE, max_tokens=48, temperature=0,
                                       extra_body={"ignore_eos": True}).choices[0].text
             for model in ("tiny_decoder", "tiny_draft")]
    assert texts[0] and texts[0] == texts[1]
    page = scrape(server.metrics_url)
    ours = (("model", "tiny_draft"), ("version", "1"))
    assert page[("hubserve_generation_spec_backoffs_total", ours)] >= 1
    assert page[("hubserve_generation_spec_requests_backing_off", ours)] == 0
    assert page[("hubserve_generation_spec_draft_tokens_total", ours)] > 0
    assert page[("hubserve_generation_spec_accepted_tokens_total", ours)] < \
        page[("hubserve_generation_spec_draft_tokens_total", ours)]
    plain = (("model", "tiny_decoder"), ("version", "1"))
    assert ("hubserve_generation_spec_backoffs_total", plain) not in page
    assert ("hubserve_generation_spec_backoffs_total", (("model", "tiny_spec"), ("version", "1"))) in page
