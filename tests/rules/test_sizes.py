"""Small rooms. No Python module of the product (velocity/, client/) over 300
lines, and each Triton model's model.py, an adapter, at most 150: what grows splits by concept."""
from __future__ import annotations

from triton_server import ROOT

MODULE_LINES, ADAPTER_LINES = 300, 150


def lines(path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_over_300_lines():
    big = {str(p.relative_to(ROOT)): lines(p) for d in ("velocity", "client") for p in (ROOT / d).rglob("*.py")
           if lines(p) > MODULE_LINES}
    assert not big, f"split these by concept (at most {MODULE_LINES} lines): {big}"


def test_each_triton_adapter_within_150_lines():
    big = {str(p.relative_to(ROOT)): lines(p) for p in (ROOT / "model_repository").glob("*/1/model.py")
           if lines(p) > ADAPTER_LINES}
    assert not big, f"move what is not Triton's into velocity.serving (at most {ADAPTER_LINES} lines): {big}"
