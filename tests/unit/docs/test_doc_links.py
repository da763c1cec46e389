"""Every relative link in the documents resolves: README.md, docs/*.md, perf/README.md and the other pages
(perf/history/, model_repository/, deploy/).

A link is `[text](target)`; a target that is not a URL must name a file or folder of this checkout, and its
`#anchor`, if any, a heading of the Markdown file it names (as GitHub slugs headings). Pages move and
headings get renamed as the house changes; this is what catches the link left behind. In-process, no server.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from conftest import ROOT

DOCUMENTS = sorted([ROOT / "README.md", ROOT / "perf" / "README.md", *(ROOT / "docs").glob("*.md"),
                    *(ROOT / "perf" / "history").glob("*.md"), ROOT / "model_repository" / "README.md",
                    ROOT / "deploy" / "README.md"])

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, where a link is a link."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file, repeated headings numbered as GitHub numbers them."""
    seen: Counter[str] = Counter()
    found = set()
    for line in _prose(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        slug = _slug(match.group(2))
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def links(path: Path) -> list[str]:
    """The relative link targets of one document (URLs and mail addresses left out)."""
    targets = []
    for line in _prose(path.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # code spans hold no links
        for match in (*_LINK.finditer(line), *_IMAGE.finditer(line)):
            target = match.group(1)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                targets.append(target)
    return targets


def _shown(path: Path) -> str:
    """A file as a message names it: from the checkout's root where it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def broken(path: Path) -> list[str]:
    """The links of `path` that name no file, or no heading of the file they name."""
    bad = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            bad.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            bad.append(f"{target}: no such heading in {_shown(resolved)}")
    return bad


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken(path) == []


def test_the_slugs_are_githubs() -> None:
    heading = "Generative models over Triton's protocols (ModelStreamInfer, generate, generate_stream)"
    slug = "generative-models-over-tritons-protocols-modelstreaminfer-generate-generate_stream"
    assert _slug(heading) == slug
    assert _slug("Processes (`--workers N`: bench_workers.py, bench_channel.py)") == (
        "processes---workers-n-bench_workerspy-bench_channelpy"
    )


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) [no heading](#nowhere)\n```\n[x](x)\n```\n")
    assert broken(page) == ["missing.md: no such file", "#nowhere: no such heading in page.md"]
