"""DVAE decoder and Vocos: the release's tensor names, the FSQ code embedding, shapes."""
from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from velocity.model.loader import WeightError
from velocity.model.audio_models import load_dvae, load_vocos
from checkpoints import tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("audio") / "tiny", seed=1)


def test_fsq_embedding_equals_vector_quantize_pytorch(ckpt):
    from vector_quantize_pytorch import GroupedResidualFSQ

    dvae = load_dvae(ckpt)
    ref = GroupedResidualFSQ(dim=1024, levels=[5, 5, 5, 5], num_quantizers=2, groups=2).eval()
    ref.load_state_dict({k.removeprefix("vq_layer.quantizer."): v for k, v in dvae.state_dict().items()
                         if k.startswith("vq_layer.quantizer.")})
    codes = torch.randint(0, 625, (3, 4, 17))                     # [B, num_vq, T]
    B, _, T = codes.shape
    # the release's arrangement: [B, T, G, R] -> [G, B, T, R]
    idx = codes.transpose(1, 2).reshape(B, T, 2, 2).permute(2, 0, 1, 3)
    with torch.no_grad():
        want = ref.get_output_from_indices(idx).transpose(1, 2)     # [B, 1024, T]
    torch.testing.assert_close(dvae.embed(codes), want, rtol=0, atol=1e-6)


def test_release_names_round_trip(ckpt):
    asset = ckpt / "asset"
    dvae, vocos = load_dvae(ckpt), load_vocos(ckpt)
    for f, model in [(asset / "DVAE.safetensors", dvae), (asset / "Vocos.safetensors", vocos)]:
        stored = load_file(str(f))
        ours = model.state_dict()
        assert ours, f
        for name, t in ours.items():
            assert torch.equal(t, stored[name]), name
    with safe_open(str(asset / "Vocos.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"feature_extractor.mel_spec.mel_scale.fb", "head.istft.window", "backbone.embed.weight",
            "backbone.convnext.7.gamma", "head.out.weight"} <= names
    assert load_file(str(asset / "DVAE.safetensors"))["coef"].shape == (1, 100, 1)


def test_one_frame_is_two_mels_and_512_samples(ckpt):
    dvae, vocos = load_dvae(ckpt), load_vocos(ckpt)
    codes = torch.randint(0, 625, (2, 4, 11))
    mel = dvae(codes)
    assert mel.shape == (2, 100, 22)
    audio = vocos(mel)
    assert audio.shape == (2, 11 * 512) and torch.isfinite(audio).all()
    # rows of a batch are decoded independently
    torch.testing.assert_close(vocos(dvae(codes[1:])), audio[1:], rtol=1e-4, atol=1e-6)


def test_wrong_shape_names_file_and_tensor(ckpt, tmp_path):
    import shutil
    out = tmp_path / "c"
    shutil.copytree(ckpt, out)
    f = out / "asset" / "Vocos.safetensors"
    t = load_file(str(f))
    t["backbone.embed.weight"] = t["backbone.embed.weight"][:, :99].contiguous()
    save_file(t, str(f))
    with pytest.raises(WeightError, match=r"Vocos.safetensors: tensor 'backbone.embed.weight' has shape"):
        load_vocos(out)


def test_loading_every_model_imports_no_compiler_machinery(ckpt):
    """The GPT, the DVAE and the Vocos built on the meta device and filled, in a fresh process,
    import neither torch._dynamo nor sympy: their first use (an nn.init initialiser or to_empty
    run on torch's Python reference kernels) slowed every server process's start."""
    import subprocess
    import sys

    code = (f"import sys, torch\nfrom velocity.model.loader import load_model\n"
            f"from velocity.model.audio_models import load_dvae, load_vocos\n"
            f"load_model({str(ckpt)!r}, torch.device('cpu'), torch.float32)\n"
            f"load_dvae({str(ckpt)!r}); load_vocos({str(ckpt)!r})\n"
            f"print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
