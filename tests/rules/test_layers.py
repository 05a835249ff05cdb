"""The house's layers: an import only points down (docs/architecture.md).

    0  velocity.config, velocity.sampling_params, velocity.release   plain data, no torch models;
       velocity.device                                              which torch device and dtype
    1  velocity.model     the networks and their loaders
    2  velocity.engine    sequences, blocks, scheduling, workers, sampling; velocity.llm over it
    3  velocity.tts       text front end, speakers, streaming decode, pipeline; velocity.demo
    4  velocity.serving   settings, validation and the pieces the Triton models share
    5  velocity.gateway   the OpenAI-compatible API in front of the server
"""
from __future__ import annotations

import ast
import subprocess
import sys

from triton_server import ROOT

RANKS = {"velocity.config": 0, "velocity.sampling_params": 0, "velocity.release": 0, "velocity.device": 0,
         "velocity.model": 1,
         "velocity.engine": 2, "velocity.llm": 2, "velocity.tts": 3, "velocity.demo": 3, "velocity.serving": 4,
         "velocity.gateway": 5}


def rank(module: str) -> int:
    return next(r for prefix, r in RANKS.items() if module == prefix or module.startswith(prefix + "."))


def test_imports_only_point_down():
    bad = []
    for path in sorted((ROOT / "velocity").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if module == "velocity":
            continue                         # the package's lazy public names
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                if name.startswith("velocity.") and rank(name) > rank(module):
                    bad.append(f"{module} imports {name}")
    assert not bad, bad


def test_block_manager_and_scheduler_need_no_torch():
    code = ("import sys; import velocity.engine.block_manager, velocity.engine.scheduler; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_the_sampler_sees_tensors_not_sequences():
    """The runner prepares the samplers' tensors (sampling_rows: sampling_batch, SamplingRows); the
    samplers never import the sequence module."""
    code = ("import sys; import velocity.engine.sampler, velocity.engine.graph_sampler; "
            "print('velocity.engine.sequence' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_the_client_reaches_no_gateway():
    """client/ talks to Triton; what it shares with the gateway (the request table, the sentence
    rule, the response types) lives below both, in velocity.serving and velocity.tts."""
    bad = []
    for path in sorted((ROOT / "client").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            bad += [f"{path.relative_to(ROOT)} imports {n}" for n in names if n.startswith("velocity.gateway")]
    assert not bad, bad


# velocity.serving's rooms (docs/architecture.md): an import points to a room of a lower rank,
# or within its own room; settings and metrics sit below them all
ROOMS = {"settings": 0, "metrics": 0, "wire": 1, "boards": 1, "lifecycle": 2, "front": 3, "llm": 3, "vocoder": 3}


def test_the_serving_rooms_import_only_down():
    """The contract (wire) imports nothing of the server's life, the streams or the vocoder; the
    llm, the vocoder and the front end know nothing of each other."""
    bad = []
    for path in sorted((ROOT / "velocity" / "serving").rglob("*.py")):
        parts = path.relative_to(ROOT / "velocity" / "serving").with_suffix("").parts
        if parts[0] == "__init__":
            continue
        mine = parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                if not name.startswith("velocity.serving."):
                    continue
                room = name.split(".")[2]
                if room != mine and ROOMS[room] >= ROOMS[mine]:
                    bad.append(f"{'/'.join(parts)} ({mine}) imports {name}")
    assert not bad, bad
    rooms = {p.name for p in (ROOT / "velocity" / "serving").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms | {"settings", "metrics"} == set(ROOMS), "give a new room its rank here"


# velocity.model's rooms, as nano-vllm splits layers from models: kernels below the layers, the
# layers below the networks (each with its config), the loaders of folders on top
MODEL_ROOMS = {"kernels": 0, "layers": 1, "networks": 2, "loading": 3}


def test_the_model_rooms_import_only_down():
    bad = []
    for path in sorted((ROOT / "velocity" / "model").rglob("*.py")):
        parts = path.relative_to(ROOT / "velocity" / "model").with_suffix("").parts
        if parts[0] == "__init__":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                if name.startswith("velocity.model.") and (room := name.split(".")[2]) != parts[0] \
                        and MODEL_ROOMS[room] >= MODEL_ROOMS[parts[0]]:
                    bad.append(f"{'/'.join(parts)} imports {name}")
    assert not bad, bad
    rooms = {p.name for p in (ROOT / "velocity" / "model").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == set(MODEL_ROOMS), "give a new room its rank here"
