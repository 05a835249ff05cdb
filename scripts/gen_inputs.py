"""Write what the request table (velocity/serving/wire/input_table.py) defines into the files that cannot
import it: the inputs of the `tts` ensemble (and their map into text_frontend), of text_frontend
and of tts_offline, in their config.pbtxt, and the inputs table of docs/api.md. serve.sh runs
Triton without auto-complete (each Python model's auto-complete is a stub process of its own at
every start), so the configs are whole as written.

    .venv/bin/python scripts/gen_inputs.py            # write them
    .venv/bin/python scripts/gen_inputs.py --check    # exit 1 and show the difference if stale
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from velocity.serving.wire.input_table import INPUTS, triton_inputs  # noqa: E402

REPO = ROOT / "model_repository"
CONFIG = REPO / "tts" / "config.pbtxt"
# text_frontend's one input of its own: tts_offline's check of a request (PROBLEM says what is wrong
# with it, "" if nothing, as a result: a BLS caller gets an error response's code as INTERNAL)
CHECK_ONLY = {"name": "CHECK_ONLY", "data_type": "TYPE_BOOL", "dims": [1], "optional": True}
API = ROOT / "docs" / "api.md"
BEGIN, END = "<!-- inputs: written by scripts/gen_inputs.py -->", "<!-- end of inputs -->"


def model_inputs(model: str) -> list[dict]:
    return triton_inputs(model) + ([CHECK_ONLY] if model == "text_frontend" else [])


def with_inputs(text: str, model: str) -> str:
    """A config.pbtxt with its input block (before its output block) from the table."""
    rows = ",\n".join(f'  {{ name: "{i["name"]}", data_type: {i["data_type"]}, '
                      f'dims: [ {", ".join(map(str, i["dims"]))} ], optional: {str(i["optional"]).lower()} }}'
                      for i in model_inputs(model))
    text = re.sub(r"(?ms)^input \[\n.*?^\]\n", "", text, count=1)
    return text.replace("output [\n", f"input [\n{rows}\n]\noutput [\n", 1)


def config_text(text: str) -> str:
    """The ensemble's config with its input block and text_frontend's input_map from the table."""
    text = with_inputs(text, "tts")
    maps = "".join(f'      input_map {{ key: "{i.name}" value: "{i.name}" }}\n' for i in INPUTS)
    return re.sub(r'(?s)(model_name: "text_frontend"\n      model_version: -1\n)(?:      input_map [^\n]*\n)*',
                  lambda m: m[1] + maps, text, count=1)


def api_text(text: str) -> str:
    """docs/api.md with the inputs table between the markers."""
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| input | type | what | OpenAI API field | client option |", "|---|---|---|---|---|"]
    lines += [f"| `{i.name}` | {i.dtype} | {cell(i.describe())} | {f'`{i.api_field}`' if i.api_field else ''} | "
              f"{f'`{i.cli_flag}`' if i.cli_flag else ''} |" for i in INPUTS]
    table = "\n".join(lines)
    return re.sub(f"(?s){re.escape(BEGIN)}.*?{re.escape(END)}", lambda _: f"{BEGIN}\n{table}\n{END}", text, count=1)


FILES = [(CONFIG, config_text), (API, api_text)] + [
    (REPO / m / "config.pbtxt", lambda text, m=m: with_inputs(text, m)) for m in ("text_frontend", "tts_offline")]


def stale() -> list[str]:
    """A unified diff for each file that differs from what the table writes (empty: up to date)."""
    out = []
    for path, make in FILES:
        old = path.read_text()
        new = make(old)
        if new != old:
            out.append("".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                    str(path.relative_to(ROOT)), "from the table")))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    args = ap.parse_args()
    if args.check:
        diffs = stale()
        sys.stdout.write("".join(diffs))
        return 1 if diffs else 0
    for path, make in FILES:
        path.write_text(make(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
