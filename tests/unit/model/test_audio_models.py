"""DVAE decoder and Vocos: the release's tensor names, the FSQ code embedding, shapes."""
from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from velocity.model.loading.loader import WeightError
from velocity.model.loading.audio_models import load_dvae, load_vocos
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


def test_audio_models_load_at_the_sizes_their_files_have(ckpt, tmp_path):
    """The release's sizes from the release-size files; the small demo folder's (narrow, shallow
    stacks, as the server tests use) from its files, every tensor filled, and a frame still two
    mel frames and 512 samples."""
    from dataclasses import replace

    from velocity.demo.audio_weights import SMALL_STACK, SMALL_VOCOS
    from velocity.model.loading.audio_models import load_decoder
    from velocity.model.networks.dvae_config import DVAEConfig, decoder_config
    from velocity.model.networks.vocos import VocosConfig

    assert (load_dvae(ckpt).cfg, load_vocos(ckpt).cfg) == (DVAEConfig(), VocosConfig())
    assert load_decoder(ckpt).cfg == decoder_config(64)
    small = tiny_checkpoint(tmp_path / "small", seed=1, small_audio=True)
    dvae, decoder, vocos = load_dvae(small), load_decoder(small), load_vocos(small)
    assert dvae.cfg == replace(DVAEConfig(), **SMALL_STACK) and vocos.cfg == SMALL_VOCOS
    assert decoder.cfg == replace(decoder_config(64), **SMALL_STACK)
    assert len(vocos.backbone.convnext) == SMALL_VOCOS.num_layers and len(dvae.decoder.decoder_block) == 2
    audio = vocos(dvae(torch.randint(0, 625, (1, 4, 11))))
    assert audio.shape == (1, 11 * 512) and torch.isfinite(audio).all() and audio.abs().max() > 0


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


def fresh_process(code: str) -> list[str]:
    """The lines `code` prints, run in a fresh interpreter (what a server process imports)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()


def test_loading_every_model_imports_no_compiler_machinery(ckpt):
    """The GPT, the DVAE and the Vocos built on the meta device and filled, in a fresh process,
    import neither torch._dynamo nor sympy: their first use (an nn.init initialiser or to_empty
    run on torch's Python reference kernels) slowed every server process's start."""
    code = (f"import sys, torch\nfrom velocity.model.loading.loader import load_model\n"
            f"from velocity.model.loading.audio_models import load_dvae, load_vocos\n"
            f"load_model({str(ckpt)!r}, torch.device('cpu'), torch.float32)\n"
            f"load_dvae({str(ckpt)!r}); load_vocos({str(ckpt)!r})\n"
            f"print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))")
    assert fresh_process(code)[-1] == "[]"


def test_the_text_front_end_reads_sample_strings_without_the_encoder_and_loads_it_for_a_recording(ckpt):
    """What the text_frontend stub builds (TTSFront.from_env's parts), in a fresh process: a voice
    sample string is read and checked without the DVAE encoder (not even its module imported);
    the first recording loads it, and its codes are those of an encoder loaded directly."""
    code = (f"import sys\nimport numpy as np\nfrom velocity.tts.frontend import TextFrontend\n"
            f"from velocity.tts.speaker import encode_sample\nfrom velocity.tts.voice_sample import VoiceEncoder\n"
            f"from velocity.tts.voices import Voices\n"
            f"text = TextFrontend({str(ckpt)!r}, None)\nenc = VoiceEncoder({str(ckpt)!r})\n"
            f"Voices({str(ckpt)!r}, text.speaker_dim, text.speaker_stats, None, None)\n"
            f"codes = enc.sample_codes(encode_sample(np.arange(12).reshape(4, 3) % 625))\n"
            f"print(codes.shape, 'velocity.model.networks.dvae' in sys.modules)\n"
            f"t = np.arange(12000) / 24000\n"
            f"print(enc.encode((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)).tolist())\n")
    first, codes = fresh_process(code)[-2:]
    assert first == "(4, 3) False", first
    t = torch.arange(12000, dtype=torch.float64) / 24000
    with torch.inference_mode():
        want = load_dvae(ckpt, encoder=True).encode((0.3 * torch.sin(2 * torch.pi * 220 * t)).float())
    assert eval(codes) == want.tolist()
