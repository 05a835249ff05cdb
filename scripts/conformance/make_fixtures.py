"""Record what the reference implementation (chattts==0.2.5) does, as fixtures for CI.

    scripts/conformance/regenerate.sh           # setup_venv.sh, then this in .refvenv

Runs in .refvenv (the reference is AGPL: a side environment, never imported by the project).
It writes a demo folder with the project's own writer (velocity.demo.checkpoint, seeded, so CI
rebuilds the same bytes without the reference), loads every file into the reference's modules
strictly (the release's file set and tensor names), and records the reference's outputs on
those weights in tests/fixtures/chattts_0.2.5/:

  manifest.json   the release's files: tensor names, shapes and dtypes as the reference's
                  modules define them (release dimensions; the GPT body's names per layer),
                  plus the SHA-256 of each weights file the writer produced
  audio.npz       seeded codes and hidden states, and the reference's mel and waveform for
                  both decode paths: DVAE(codes) (use_decoder=False) and Decoder(hidden
                  states) (use_decoder=True, its default), each followed by Vocos
  sampling.npz    seeded logits and frame histories, and what the reference's logits
                  processing leaves of them (temperature, repetition penalty over 16 frames,
                  top-P, top-K, the min_new_token mask) for several parameter sets
  speakers.npz    speaker strings and the vector the reference's Speaker.apply puts at the
                  [spk_emb] position for each; random speakers it draws after torch.manual_seed
                  from given (seeded) speaker statistics
  greedy.npz      near-greedy generation (temperature 1e-6: the reference has no greedy mode
                  and keeps 3 candidates, so this is its argmax) on the demo GPT, one text at a
                  time, with and without a speaker: the prompt ids, frames and hidden states,
                  and the waveform of each decode path (Chat._decode_to_wavs)
  frontend.npz    the prompt ids of each piece of a set of texts through the reference's text
                  path (its split, normaliser and homophones, prompt template, tokenizer)
  traditional.npz the same for traditional-Chinese texts
  carried.npz     the reference's voice carry-over (a text of several pieces, no sample): the
                  sample it makes of the first piece's audio, every piece's frames and hidden
                  states after it, and the audio
  voice.npz       voice samples: seeded test audio, the reference's log-mel of it, the codes of
                  Chat.sample_audio_speaker (mel, DVAE encoder, quantizer) and the sample string
                  it makes of them; torchaudio's mel filter bank as the reference configures it
  cloned.npz      near-greedy generation with a voice sample (the reference's spk_smp and
                  txt_smp: the sample string of voice clip 0, its transcript), with and
                  without a speaker: the prompt (text ids and the sample's frames), frames and
                  hidden states
  refine.npz      near-greedy text refine (Chat._refine_text, temperature 1e-6) of two texts with
                  two refine prompts: the refine prompt ids, the generated ids, the refined text
                  (ids below [break_0], decoded) and the audio prompt ids made from it
  versions.json   the versions of the reference and its dependencies the fixtures come from

It also writes checkpoints/reference-full (--full-folder): the full-size demo folder, loaded by
the reference's own Chat._load, for local runs (not committed; about 1 GB).
"""
from __future__ import annotations

import argparse
import copy
import importlib.metadata as md
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from text_fixtures import TRADITIONAL_TEXTS, frontend, speakers  # noqa: E402  (beside this script)
from voice_fixtures import carried, cloned, refine, voice  # noqa: E402

SIZE, SEED = "tiny", 0        # the demo folder the fixtures are recorded on (tests rebuild it)
FRAMES = 40                   # GPT frames decoded (0.85 s of audio)


def reference_modules(gpt_hidden: int, text_vocab: int) -> dict[str, torch.nn.Module]:
    """The reference's modules for each weights file, built as its Chat._load builds them."""
    from ChatTTS.config import Config
    from ChatTTS.model.dvae import DVAE
    from ChatTTS.model.embed import Embed
    from vocos import Vocos
    from vocos.pretrained import instantiate_class

    c = copy.deepcopy(Config())         # its dataclass defaults are shared objects
    voc = c.vocos
    vocos = Vocos(feature_extractor=instantiate_class(args=(), init=asdict(voc.feature_extractor)),
                  backbone=instantiate_class(args=(), init=asdict(voc.backbone)),
                  head=instantiate_class(args=(), init=asdict(voc.head)))
    dvae = DVAE(decoder_config=asdict(c.dvae.decoder), encoder_config=asdict(c.dvae.encoder),
                vq_config=asdict(c.dvae.vq), dim=c.dvae.decoder.idim)
    c.decoder.idim = c.decoder.odim = gpt_hidden // 2       # the Decoder reads the GPT's hidden states
    decoder = DVAE(decoder_config=asdict(c.decoder), dim=c.decoder.idim)
    embed = Embed(gpt_hidden, c.embed.num_audio_tokens, text_vocab, c.embed.num_vq)
    return {"asset/Vocos.safetensors": vocos, "asset/DVAE.safetensors": dvae,
            "asset/Decoder.safetensors": decoder, "asset/Embed.safetensors": embed}


def strict_load(module: torch.nn.Module, path: Path) -> None:
    sd = load_file(str(path))
    try:
        module.load_state_dict(sd, strict=True)
    except RuntimeError:
        want = set(module.state_dict())
        missing, unexpected = sorted(want - set(sd)), sorted(set(sd) - want)
        raise SystemExit(f"{path.name} does not load in the reference: {len(missing)} missing "
                         f"({missing[:6]}...), {len(unexpected)} unexpected ({unexpected[:6]}...)")


def manifest(folder: Path) -> dict:
    """Tensor names/shapes/dtypes of the release's files at release dimensions (reference side)."""
    from ChatTTS.config import Config
    from transformers import LlamaConfig, LlamaModel

    g = Config().gpt
    files = {}
    for name, module in reference_modules(g.hidden_size, g.num_text_tokens).items():
        files[name] = {k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in module.state_dict().items()}
    cfg = LlamaConfig(hidden_size=g.hidden_size, intermediate_size=g.intermediate_size, num_hidden_layers=1,
                      num_attention_heads=g.num_attention_heads, max_position_embeddings=g.max_position_embeddings)
    with torch.device("meta"):
        body = LlamaModel(cfg)
    files["asset/gpt/model.safetensors"] = {
        k.replace("layers.0.", "layers.N."): [list(v.shape), str(v.dtype).removeprefix("torch.")]
        for k, v in body.state_dict().items()}
    from velocity.release import sha256_file

    sha = {str(p.relative_to(folder)): sha256_file(p)
           for p in sorted(folder.rglob("*.safetensors"))}
    return {"files": files, "optional": ["embed_tokens.weight"], "gpt_layers": g.num_hidden_layers,
            "demo": {"size": SIZE, "seed": SEED, "sha256": sha}}


@torch.inference_mode()
def audio(folder: Path, mods: dict) -> dict[str, np.ndarray]:
    """Both decode paths of the reference (Chat._decode_to_wavs then _vocos_decode) on seeded input."""
    rng = np.random.default_rng(1234)
    codes = rng.integers(0, 625, (1, 4, FRAMES)).astype(np.int64)
    gpt_hidden = mods["asset/Decoder.safetensors"].decoder.conv_in[0].in_channels * 2
    hidden = rng.standard_normal((1, gpt_hidden, FRAMES)).astype(np.float32)
    dvae, decoder, vocos = mods["asset/DVAE.safetensors"], mods["asset/Decoder.safetensors"], mods["asset/Vocos.safetensors"]
    out = {"codes": codes, "hidden": hidden}
    for path, model, x in [("dvae", dvae, torch.from_numpy(codes)), ("decoder", decoder, torch.from_numpy(hidden))]:
        mel = model(x.clone())
        out[f"mel_{path}"] = mel.numpy()
        out[f"wav_{path}"] = vocos.decode(mel).numpy()
    return out


# (temperature, top_P, top_K, repetition_penalty, min_new_token): the reference's defaults first
SAMPLING_CASES = [(0.3, 0.7, 20, 1.05, 0), (0.7, 0.95, 5, 1.3, 0), (1.0, 0.5, None, 1.0, 0),
                  (0.3, 1.0, 50, 1.05, 0), (0.3, 0.7, 20, 1.05, 100), (1.5, 0.3, 2, 1.05, 0)]


@torch.inference_mode()
def sampling() -> dict[str, np.ndarray]:
    """The reference's logits processing as GPT.generate applies it for audio codes: logits per
    (frame, codebook) row / temperature, then the processors of gen_logits in the order _infer_code
    passes them (repetition penalty, then top-P, then top-K), then the min_new_token mask."""
    from ChatTTS.model.processors import gen_logits

    rng = np.random.default_rng(99)
    B, K, V, T = 24, 4, 626, 24
    logits = (rng.standard_normal((B, K, V)) * 3).astype(np.float32)
    logits[::3, :, 7] += 12                                          # some peaked rows: few candidates
    logits[1::4, :, 625] += 6                                        # the end code likely in some rows
    hist = rng.integers(0, 40, (B, T, K))                            # small range: repeats to penalise
    out = {"logits": logits, "history": hist, "cases": np.array(
        [[t, p, -1 if k is None else k, r, m] for t, p, k, r, m in SAMPLING_CASES], np.float64)}
    for n, (temp, top_p, top_k, rep, min_new) in enumerate(SAMPLING_CASES):
        warpers, processors = gen_logits(num_code=V - 1, top_P=top_p, top_K=top_k, repetition_penalty=rep)
        x = torch.from_numpy(logits).reshape(B * K, V).clone()
        x /= torch.tensor([temp] * K).unsqueeze(0).expand(B, -1).contiguous().view(-1, 1)
        tokens = torch.from_numpy(hist).permute(0, 2, 1).reshape(B * K, T)
        for proc in (*processors, *warpers):
            x = proc(tokens, x)
        if min_new > T:
            x[:, V - 1] = -torch.inf
        out[f"filtered_{n}"] = x.reshape(B, K, V).numpy()
    return out


GREEDY_TEXTS = ["hello world", "this is a test of the engine", "the quick brown fox jumps over the lazy dog"]
GREEDY_FRAMES = 30


def reference_chat(folder: Path, device: str = "cpu"):
    """The reference's Chat on a demo folder, through its own loader (Chat._load: the public
    load() would check the release's SHA-256 values), its config set to the folder's GPT size."""
    import ChatTTS

    cfg = json.loads((folder / "asset" / "gpt" / "config.json").read_text())
    text_vocab = load_file(str(folder / "asset" / "Embed.safetensors"))["emb_text.weight"].shape[0]
    chat = ChatTTS.Chat()
    chat.config = copy.deepcopy(chat.config)     # its dataclass defaults are shared objects
    g, e = chat.config.gpt, chat.config.embed
    g.hidden_size, g.intermediate_size = cfg["hidden_size"], cfg["intermediate_size"]
    g.num_attention_heads, g.num_hidden_layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]
    g.max_position_embeddings, g.num_text_tokens = cfg["max_position_embeddings"], text_vocab
    chat.config.decoder.idim = chat.config.decoder.odim = cfg["hidden_size"] // 2
    e.hidden_size, e.num_text_tokens = cfg["hidden_size"], text_vocab
    a = folder / "asset"
    assert chat._load(vocos_ckpt_path=str(a / "Vocos.safetensors"), dvae_ckpt_path=str(a / "DVAE.safetensors"),
                      gpt_ckpt_path=str(a / "gpt"), embed_path=str(a / "Embed.safetensors"),
                      decoder_ckpt_path=str(a / "Decoder.safetensors"), tokenizer_path=str(a / "tokenizer"),
                      device=torch.device(device))
    return chat


@torch.inference_mode()
def greedy(folder: Path) -> dict[str, np.ndarray]:
    import ChatTTS

    from velocity.tts.speaker import encode_speaker

    chat = reference_chat(folder)
    hidden = chat.config.gpt.hidden_size
    speaker = encode_speaker(np.random.default_rng(3).standard_normal(hidden))
    out: dict[str, np.ndarray] = {"texts": np.array(GREEDY_TEXTS), "speaker": np.array(speaker)}
    for n, text in enumerate(GREEDY_TEXTS):
        for spk in (None, speaker):
            params = ChatTTS.Chat.InferCodeParams(temperature=1e-6, max_new_token=GREEDY_FRAMES, spk_emb=spk,
                                                  show_tqdm=False)
            ids, _, _ = chat.tokenizer.encode(chat.speaker.decorate_code_prompts([text], params.prompt, None, spk),
                                              chat.config.gpt.num_vq)
            r = list(chat._infer_code([text], False, torch.device("cpu"), True, params))[-1]
            key = f"{n}_{'spk' if spk else 'none'}"
            out[f"prompt_{key}"] = ids[0, :, 0].numpy()
            out[f"frames_{key}"] = r.ids[0].numpy()
            out[f"hidden_{key}"] = r.hiddens[0].float().numpy()
            # the whole decode of each path, as Chat.infer does for one text (use_decoder: its default)
            out[f"wav_hidden_{key}"] = chat._decode_to_wavs([h.clone() for h in r.hiddens], True)[0]
            out[f"wav_codes_{key}"] = chat._decode_to_wavs([i.clone() for i in r.ids], False)[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "chattts_0.2.5"))
    ap.add_argument("--full-folder", default=str(ROOT / "checkpoints" / "reference-full"),
                    help="also write a full-size folder (release dimensions, seeded; about 1 GB) that the "
                         "reference loads, for local runs ('' to skip)")
    ap.add_argument("--only", default="", help="comma-separated fixture names (e.g. frontend,carried) to write "
                    "only those; default: all")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = set(filter(None, args.only.split(",")))
    from velocity.demo.checkpoint import SIZES, write_checkpoint

    def save(name: str, make) -> None:
        if not only or name in only:
            np.savez_compressed(out / f"{name}.npz", **make())

    torch.manual_seed(0)                     # the reference's constructors draw random initial values
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_checkpoint(Path(tmp) / "demo", SIZE, SEED)
        s = SIZES[SIZE]
        mods = reference_modules(s.hidden, s.text_vocab)
        for name, module in mods.items():
            strict_load(module.eval(), folder / name)
        if not only:
            (out / "manifest.json").write_text(json.dumps(manifest(folder), indent=1) + "\n")
        save("audio", lambda: audio(folder, mods))
        save("greedy", lambda: greedy(folder))
        voices = voice(mods)
        save("voice", lambda: voices)
        chat = reference_chat(folder)
        save("cloned", lambda: cloned(chat, str(voices["string_0"]), GREEDY_TEXTS[:2], GREEDY_FRAMES))
        save("refine", lambda: refine(chat, GREEDY_TEXTS[:2]))
        save("carried", lambda: carried(chat, GREEDY_FRAMES))
    save("sampling", sampling)
    save("speakers", speakers)
    save("frontend", frontend)
    save("traditional", lambda: frontend(TRADITIONAL_TEXTS))
    pkgs = ["chattts", "torch", "torchaudio", "vector-quantize-pytorch", "vocos", "transformers", "numpy"]
    (out / "versions.json").write_text(json.dumps({p: md.version(p) for p in pkgs}, indent=1) + "\n")
    print(f"[conformance] wrote {out}")
    if args.full_folder:
        full = write_checkpoint(Path(args.full_folder), "full", SEED)
        reference_chat(full)                      # loads every file strictly at the release's dimensions
        print(f"[conformance] wrote {full}, a full-size folder the reference loads: make serve WEIGHTS={full}")


if __name__ == "__main__":
    main()
