"""The benchmarks page answers "how fast is it?" first and stays short: its first table is the
headline (a row for CPU float32, CPU int8, H100 and H200), the dated runs live in its history,
and the README opens with what it is and the two commands."""
from __future__ import annotations

import re

from triton_server import ROOT

MAX_LINES = 400


def test_the_benchmarks_page_is_short_and_opens_with_the_headline():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert len(page.splitlines()) <= MAX_LINES, "move the dated runs to docs/benchmarks/history.md"
    first = page[page.index("\n|"):].split("\n\n")[0]
    assert page.index("## How fast is it?") < page.index("\n|")
    rows = [r.split("|")[1].strip() for r in first.strip().splitlines()[2:]]
    assert rows == ["CPU, float32", "CPU, int8", "NVIDIA H100, bfloat16", "NVIDIA H200, bfloat16"], rows
    assert "first audio p50" in first and "streams in real time" in first and "command" in first


def test_the_readme_opens_with_what_it_is_and_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    top = "\n".join(readme.splitlines()[:40])
    assert "make serve" in top and "make test" in top
    assert not re.search(r"TOKEN_IDS|SENTENCE_LENGTHS|PARAMS_F", top), "the tensor names belong in docs/api.md"
