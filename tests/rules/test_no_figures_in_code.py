"""A measured figure lives once, in docs/benchmarks.md. Code, its comments, its
docstrings and the settings' help say what a thing does (and may name the benchmark that
measures it), never a speed-up or the date of a measurement: those go stale while the code stays."""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIRS = ("velocity", "client", "model_repository", "scripts", "benchmarks")
SPEED_UP = re.compile(r"(?<![0-9A-Za-z.])\d+(\.\d+)?(-\d+(\.\d+)?)?x(?![0-9A-Za-z])")   # "2.6x", "1.5-3x"; not 0x1f
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")                                        # "2026-11-23"


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each comment and string constant in a Python file."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            out.append((tok.start[0], tok.string))
    return out


def test_the_check_finds_a_quoted_figure(tmp_path):
    f = tmp_path / "x.py"
    f.write_text('"""Packed: 2.6x faster (measured 2026-11-23)."""\nX = 0x1f  # a 3x3 kernel? no: 1.5-2x\n')
    found = [h.split(": ", 1)[1] for h in quoted_figures_at(f, tmp_path)]
    assert [h.split(" in ")[0] for h in found] == ["'2.6x'", "'2026-11-23'", "'1.5-2x'"], found


def quoted_figures_at(path: Path, root: Path) -> list[str]:
    return [f"{path.relative_to(root)}:{line}: {m.group(0)!r} in {text.strip()[:80]!r}"
            for line, text in prose(path) for pattern in (SPEED_UP, DATE) for m in pattern.finditer(text)]


def test_no_python_file_quotes_a_speed_up_or_a_date():
    found = [h for d in DIRS for p in sorted((ROOT / d).rglob("*.py")) for h in quoted_figures_at(p, ROOT)]
    assert not found, "figures belong in docs/benchmarks.md (name the benchmark instead):\n" + "\n".join(found)


def test_the_settings_help_quotes_no_speed_up_or_date():
    """docs/configuration.md: each setting's help, and the guides beside them, link the benchmark."""
    text = (ROOT / "docs" / "configuration.md").read_text().splitlines()
    found = [f"docs/configuration.md:{i}: {m.group(0)!r}" for i, line in enumerate(text, 1)
             for pattern in (SPEED_UP, DATE) for m in pattern.finditer(line)]
    assert not found, "figures belong in docs/benchmarks.md:\n" + "\n".join(found)
