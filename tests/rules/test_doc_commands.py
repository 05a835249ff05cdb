"""Every command in the README and docs/ names a program that exists and only options it takes.

The commands that can run here run as written in the tests of what they do (test_readme: the
Python snippet, the curl commands and the tables; test_weights_commands: download, check,
demo; test_wyoming, test_tts_server: the voice tool, the clients; test_benchmarks). Many cannot
run in CI (docker, kubectl, a GPU, a benchmark of minutes, the reference's venv): this test holds
each of them, and the others, to the code they call, so a renamed option or a moved script fails
here instead of in a reader's terminal. No server; every Python program's parser is read in one
process (its parse_args stopped before it runs).
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib

from triton_server import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]   # not docs/benchmarks/history.md
PROGRAM = r"(?:[A-Z_]+=\S+\s+)*(?:\.venv/bin/\S+|(?:bash\s+)?(?:scripts|benchmarks)/\S+\.(?:sh|py)|make|docker|kubectl)\b"
EXTERNAL = {"curl", "aplay", "docker", "kubectl", "pip"}


def doc_commands() -> list[tuple[str, str]]:
    """(where, command): the lines of code blocks (indented or fenced, `\\` continuations joined)
    and the inline code spans that start with one of the project's programs."""
    found = []
    for path in DOCS:
        lines, fence, i = path.read_text(encoding="utf-8").splitlines(), False, 0
        while i < len(lines):
            line = lines[i]
            if line.strip().startswith("```"):
                fence = not fence
            elif fence or line.startswith("    "):
                cmd = line.strip()
                while cmd.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
                if re.match(PROGRAM, cmd):
                    found.append((f"{path.name}:{i + 1}", cmd))
            else:
                found += [(f"{path.name}:{i + 1}", m) for m in re.findall(r"`(" + PROGRAM + r"[^`]*)`", line)]
            i += 1
    return found


def words(cmd: str) -> list[list[str]]:
    """The command's pipeline stages as argument lists, comments, env assignments and the
    optional-argument brackets of a usage line (`[--dtype bfloat16]`) taken off."""
    toks = shlex.split(cmd, comments=True)
    stages, cur = [], []
    for t in toks + ["|"]:
        if t.startswith("[") and "]" not in t or t.endswith("]") and "[" not in t:
            t = t.strip("[]")
        if t == "&":
            continue
        if t == "|":
            stages.append(cur)
            cur = []
        elif not (not cur and re.fullmatch(r"[A-Z_]+=\S*", t)):
            cur.append(t)
    return [s for s in stages if s]


def program(args: list[str]) -> tuple[str, str, list[str]]:
    """(kind, target, its arguments): kind is python (target file:, module: or entry:), shell,
    make, pytest or external."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    head, rest = args[0], args[1:]
    if head == "bash":
        head, rest = rest[0], rest[1:]
    name = head.rsplit("/", 1)[-1]
    if head == ".venv/bin/python":
        if rest[:2] == ["-m", "pytest"]:
            return "pytest", "", rest[2:]
        if rest[0] == "-m":
            return "python", f"module:{rest[1]}", rest[2:]
        return "python", f"file:{rest[0]}", rest[1:]
    if head.startswith(".venv/bin/") and name in scripts:
        return "python", f"entry:{scripts[name]}", rest
    if head.endswith(".py"):
        return "python", f"file:{head}", rest
    if head.endswith(".sh"):
        return "shell", head, rest
    if head == "make":
        return "make", "", rest
    assert name in EXTERNAL, f"an unknown program {head!r}: teach this test what it is"
    return "external", name, rest


CAPTURE = r"""
import argparse, importlib, json, os, runpy, sys
class Got(Exception):
    pass
def stop(self, args=None, namespace=None):
    raise Got(self)
argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = stop
def options(p):
    out = set()
    for a in p._actions:
        out |= set(a.option_strings)
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                out |= options(sub)
    return out
got = {}
for target in json.loads(sys.argv[1]):
    kind, name = target.split(":", 1)
    sys.argv = [name]
    try:
        if kind == "file":
            runpy.run_path(name, run_name="__main__")
        elif kind == "module":
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            mod, func = name.split(":")
            getattr(importlib.import_module(mod), func)()
        got[target] = "ran without parsing arguments"
    except Got as g:
        got[target] = sorted(options(g.args[0]))
    except BaseException as e:
        got[target] = f"failed before parsing its arguments: {e!r}"
print("\n" + json.dumps(got))
"""


def test_every_doc_command_names_a_program_that_takes_its_options():
    commands = doc_commands()
    assert len(commands) > 60, "the docs' commands were not found: has their layout changed?"
    stages = [(where, cmd, *program(args)) for where, cmd in commands for args in words(cmd)]
    targets = sorted({t for *_, kind, t, _ in stages if kind == "python"})
    for t in targets:
        if t.startswith("file:"):
            assert (ROOT / t[5:]).is_file(), f"{t[5:]} is in the docs but not in the repository"
    p = subprocess.run([sys.executable, "-c", CAPTURE, json.dumps(targets)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT), "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    parsers = json.loads(p.stdout.strip().splitlines()[-1])
    makefile = (ROOT / "Makefile").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bad = []
    for where, cmd, kind, target, rest in stages:
        flags = {a.split("=", 1)[0] for a in rest if re.match(r"-{1,2}[a-zA-Z]", a)}
        if kind == "python":
            known = parsers[target]
            if isinstance(known, str) and (flags or rest or not known.startswith("ran")):   # (a file named in text)
                bad.append(f"{where}: {target} {known}")
            elif isinstance(known, str):
                continue
            else:
                bad += [f"{where}: {target} takes no {f}  ({cmd})" for f in sorted(flags - set(known))]
        elif kind == "shell":
            text = (ROOT / target).read_text() if (ROOT / target).is_file() else None
            if text is None:
                bad.append(f"{where}: {target} is not in the repository")
            else:
                bad += [f"{where}: {target} takes no {f}" for f in sorted(flags)
                        if not re.search(re.escape(f) + r"\)|" + re.escape(f) + r"\|", text)]
        elif kind == "make":
            goals = [a for a in rest if "=" not in a] or ["all"]
            bad += [f"{where}: make has no target {g}" for g in goals if not re.search(rf"^{g}:", makefile, re.M)]
            bad += [f"{where}: the Makefile reads no {a.split('=')[0]}" for a in rest
                    if "=" in a and not re.search(rf"\b{a.split('=')[0]}\b", makefile)]
        elif kind == "pytest":
            for a in rest:
                if a.startswith("tests/"):
                    file, _, test = a.partition("::")
                    src = (ROOT / file).read_text() if (ROOT / file).is_file() else ""
                    if not src or (test and f"def {test}(" not in src):
                        bad.append(f"{where}: no test {a}")
        elif target == "kubectl" and "-k" in rest:
            bad += [f"{where}: no kustomization in {d}" for d in rest[rest.index("-k") + 1:][:1]
                    if not (ROOT / d / "kustomization.yaml").is_file()]
        elif target == "docker" and rest[:1] == ["build"] and rest[-1] == "." and not (ROOT / "Dockerfile").is_file():
            bad.append(f"{where}: no Dockerfile in {rest[-1]}")
        elif target == "pip":
            for extra in re.findall(r"\.\[([\w,]+)\]", " ".join(rest)):
                bad += [f"{where}: no extra {e}" for e in extra.split(",")
                        if e not in pyproject["optional-dependencies"]]
    assert not bad, "doc commands that do not match the code:\n" + "\n".join(bad)


def test_the_command_check_can_fail():
    """A command with an option its program lacks, or a program that is not there, is caught."""
    assert program(words(".venv/bin/velocity-tts-client x --no-such-option")[0])[:2] == \
        ("python", "entry:client.tts_client:main")
    assert words("A=1 .venv/bin/python benchmarks/x.py --k v  # note | no") == [[".venv/bin/python", "benchmarks/x.py",
                                                                              "--k", "v"]]
    p = subprocess.run([sys.executable, "-c", CAPTURE, json.dumps(["entry:client.tts_client:main",
                                                                   "file:scripts/no_such.py"])],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT)})
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert "--seed" in got["entry:client.tts_client:main"] and "--no-such-option" not in got["entry:client.tts_client:main"]
    assert got["file:scripts/no_such.py"].startswith("failed before parsing")
