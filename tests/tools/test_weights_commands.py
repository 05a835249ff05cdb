"""The commands for users with the real weights, run as users run them (subprocesses), offline:
scripts/check_weights.py (the release's SHA-256, then load and speak) and
scripts/download_weights.py (what it fetches; a clear failure without a network)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import soundfile as sf

from triton_server import ROOT
from velocity.release import SHA256, sha256_file
from checkpoints import tiny_checkpoint


def command(script: str, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / script), *args]


def run(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command(script, *args), capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_check_weights_names_every_file_that_is_not_the_release_then_speaks_a_matching_folder(tmp_path):
    folder = tiny_checkpoint(tmp_path / "demo", seed=0)
    p = run("check_weights.py", str(folder), "--out", str(tmp_path / "a.wav"))
    assert p.returncode == 1 and not (tmp_path / "a.wav").exists()
    for name in SHA256:                                   # a demo is not the release: each file named
        assert f"error: {name}: SHA-256 " in p.stderr, p.stderr
    # against its own hashes (what the release's check does on the real folder): loads and speaks
    table = tmp_path / "sha.json"
    table.write_text(json.dumps({name: sha256_file(folder / name) for name in SHA256}))
    p = run("check_weights.py", str(folder), "--sha256", str(table), "--out", str(tmp_path / "b.wav"),
            "--max-new-tokens", "20")
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"all {len(SHA256)} files are the release's" in p.stdout and "loaded every model" in p.stdout
    audio, sr = sf.read(tmp_path / "b.wav")
    assert sr == 24000 and len(audio) > 0
    (folder / "asset" / "Vocos.safetensors").unlink()
    p = run("check_weights.py", str(folder), "--skip-hashes")
    assert p.returncode == 1 and "lacks asset/Vocos.safetensors" in p.stderr


def test_download_lists_the_release_files_and_fails_clearly_offline(tmp_path):
    p = run("download_weights.py", "--out", str(tmp_path / "w"), "--dry-run")
    assert p.returncode == 0
    fetched = {line.split(" -> ")[1] for line in p.stdout.splitlines()}
    assert fetched == {str(tmp_path / "w" / f) for f in [*SHA256, "asset/spk_stat.pt"]}
    p = run("download_weights.py", "--out", str(tmp_path / "w"), env={"HF_HUB_OFFLINE": "1"})
    assert p.returncode == 1 and p.stderr.startswith("error: cannot fetch 2Noise/ChatTTS/asset/"), p.stderr


def test_the_demo_is_rebuilt_when_an_older_velocity_wrote_it(tmp_path):
    """serve.sh's `make_demo_checkpoint.py --unless-current`: keeps this velocity's demo, rebuilds
    one whose format is older (its Decoder no longer fitting the code, say) or missing."""
    out = tmp_path / "demo-tiny"
    p = run("make_demo_checkpoint.py", "--size", "tiny", "--out", str(out), "--unless-current")
    assert p.returncode == 0 and "(first use;" in p.stdout, p.stdout + p.stderr
    stamp = (out / "asset" / "Decoder.safetensors").stat().st_mtime_ns
    p = run("make_demo_checkpoint.py", "--size", "tiny", "--out", str(out), "--unless-current")
    assert p.returncode == 0 and p.stdout == "" and (out / "asset" / "Decoder.safetensors").stat().st_mtime_ns == stamp
    meta = json.loads((out / "velocity-demo.json").read_text())
    (out / "velocity-demo.json").write_text(json.dumps({**meta, "format": meta["format"] - 1}))
    (out / "stale-file").write_text("from the old folder")
    # two servers started at once (two test runs, two `make serve`): each writes beside the folder
    # and renames its copy into place, so neither reads a half-written demo nor fails
    cmd = command("make_demo_checkpoint.py", "--size", "tiny", "--out", str(out), "--unless-current")
    both = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in both]
    assert [p.returncode for p in both] == [0, 0], outputs
    assert any("written by an older velocity" in o for o in outputs), outputs
    assert json.loads((out / "velocity-demo.json").read_text())["format"] == meta["format"]
    assert not (out / "stale-file").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-tiny"]          # no copy left beside it
