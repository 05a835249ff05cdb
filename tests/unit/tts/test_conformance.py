"""Conformance with the reference implementation (chattts==0.2.5), on fixtures it recorded.

The fixtures (tests/fixtures/chattts_0.2.5, made by scripts/conformance/regenerate.sh in a side
venv) were recorded on a demo folder written by velocity's own writer, which the reference then
loaded strictly. These tests rebuild the same folder (same bytes: checked by SHA-256) and need no
reference at test time.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from triton_server import ROOT
from velocity.release import RELEASE_FILES, sha256_file
from velocity.model.loading.audio_models import load_decoder, load_dvae, load_vocos
from velocity.demo.checkpoint import write_checkpoint
from velocity.tts.audio_decoder import AudioDecoder

FIXTURES = ROOT / "tests" / "fixtures" / "chattts_0.2.5"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
REGENERATE = "the fixtures were made from other demo weights: run scripts/conformance/regenerate.sh"


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    d = MANIFEST["demo"]
    return write_checkpoint(tmp_path_factory.mktemp("conformance") / "demo", d["size"], d["seed"])


def tensors(path: Path) -> dict[str, tuple[list[int], str]]:
    with safe_open(str(path), "pt") as f:
        return {k: (list(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}


def test_the_demo_folder_has_the_releases_files_and_tensor_names(demo):
    """Each file loaded strictly into the reference's module when the fixtures were made; here the
    names (and, for the audio models, whose dimensions the demo shares with the release, the
    shapes) must equal what the reference's modules define at the release's dimensions. The
    Decoder reads the GPT's hidden states, so its 384 (= 768 / 2) is the demo GPT's half."""
    weights = {str(p.relative_to(demo)) for p in demo.rglob("*.safetensors")}
    assert weights == set(MANIFEST["files"]) and weights <= set(RELEASE_FILES)
    gpt = json.loads((demo / "asset" / "gpt" / "config.json").read_text())
    layers = gpt["num_hidden_layers"]
    for name, want in MANIFEST["files"].items():
        got = tensors(demo / name)
        if name == "asset/gpt/model.safetensors":        # per layer, for the demo's layer count
            want = {k.replace("layers.N.", f"layers.{i}."): v for k, v in want.items()
                    for i in (range(layers) if "layers.N." in k else [0])}
        optional = set(MANIFEST["optional"])
        assert set(got) == set(want) - optional | (set(got) & optional), (
            name, sorted(set(want) - set(got))[:8], sorted(set(got) - set(want))[:8])
        if name == "asset/Decoder.safetensors":         # its in- and output width is half the GPT's hidden size
            want = {k: ([gpt["hidden_size"] // 2 if d == 384 else d for d in shape], dt)
                    for k, (shape, dt) in want.items()}
        if name in ("asset/DVAE.safetensors", "asset/Decoder.safetensors", "asset/Vocos.safetensors"):
            assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in want.items()}, name
        assert {dt for _, dt in got.values()} == {"F32"}, name


def test_the_demo_weights_are_the_ones_the_fixtures_were_recorded_on(demo):
    for name, sha in MANIFEST["demo"]["sha256"].items():
        assert sha256_file(demo / name) == sha, f"{name}: {REGENERATE}"


@pytest.mark.parametrize("path", ["dvae", "decoder"])
def test_both_decode_paths_equal_the_reference(demo, path):
    """DVAE(codes) (the reference's use_decoder=False) and Decoder(hidden states) (its default),
    then Vocos. Mel: float32 rounding of the same convolutions (1e-5 of the peak). Audio: at
    least 100 dB SNR over the reference's samples."""
    ref = np.load(FIXTURES / "audio.npz")
    model = load_dvae(demo) if path == "dvae" else load_decoder(demo)
    x = torch.from_numpy(ref["codes" if path == "dvae" else "hidden"])
    mel = model(x)
    want_mel = ref[f"mel_{path}"]
    np.testing.assert_allclose(mel.numpy(), want_mel, rtol=0, atol=1e-5 * np.abs(want_mel).max())
    decoder = AudioDecoder(load_dvae(demo), load_vocos(demo), load_decoder(demo))
    wav = decoder.decode(x if path == "dvae" else x.transpose(1, 2)).numpy()
    want = ref[f"wav_{path}"]
    assert wav.shape == want.shape == (1, 512 * x.shape[-1] - 256)      # the reference's ISTFT length
    assert snr_db(want, wav) >= 100


def snr_db(want: np.ndarray, got: np.ndarray) -> float:
    noise = got - want
    return float(10 * np.log10((want ** 2).sum() / max((noise ** 2).sum(), 1e-30)))


def test_sampling_keeps_the_references_candidates_exactly():
    """Temperature, repetition penalty over the last 16 frames, top-P then top-K (each keeping at
    least 3), the min_new_token mask: the same candidate sets and the same logits, bit for bit,
    as the reference's processing of the same logits and histories (sampling.npz)."""
    from velocity.engine.sequence import Sequence
    from velocity.sampling_params import SamplingParams
    from velocity.engine.sampling_rows import sampling_batch
    from velocity.engine.sampler import Sampler

    ref = np.load(FIXTURES / "sampling.npz")
    logits, hist = torch.from_numpy(ref["logits"]), ref["history"]
    V = logits.shape[-1]
    for n, (temp, top_p, top_k, rep, min_new) in enumerate(ref["cases"].tolist()):
        seqs = []
        for b in range(len(logits)):
            s = Sequence(f"r{b}", [1, 2, 3], SamplingParams(
                temperature=temp, top_p=top_p, top_k=max(0, int(top_k)), repetition_penalty=rep,
                min_new_tokens=int(min_new), max_new_tokens=max(256, int(min_new)), seed=b), head="audio")
            for f in hist[b].tolist():
                s.append(tuple(f))
            seqs.append(s)
        _, x, ids = Sampler().filter(logits, sampling_batch(seqs, logits.shape[1], V, {V - 1}, "chattts", 16))
        ours = torch.full_like(logits, float("-inf")).scatter(2, ids, x).numpy()
        want = ref[f"filtered_{n}"]
        assert np.array_equal(np.isfinite(ours), np.isfinite(want)), (n, int((np.isfinite(ours) != np.isfinite(want)).any(-1).sum()))
        assert np.array_equal(ours[np.isfinite(want)], want[np.isfinite(want)]), n


def test_the_speaker_row_is_the_references():
    """The [spk_emb] position's vector, bit for bit: the reference normalises the float16 speaker
    in float16 (normalising in float32 was the one cause of greedy divergence)."""
    from velocity.model.networks.chattts import speaker_row
    from velocity.tts.speaker import decode_speaker

    ref = np.load(FIXTURES / "speakers.npz")
    for s, want in zip(ref["strings"].tolist(), ref["rows"]):
        got = speaker_row(torch.from_numpy(decode_speaker(s, 768))).numpy()
        assert np.array_equal(got, want)
        f32 = torch.from_numpy(decode_speaker(s, 768))
        assert not np.array_equal((f32 / f32.norm()).numpy(), want)      # the test can tell the two apart


def test_random_speakers_are_the_references_draws():
    """SPEAKER_SEED n is the reference's speaker after torch.manual_seed(n) (Speaker._sample_random:
    randn * std + mean in float16), bit for bit, on the same statistics."""
    from velocity.tts.speaker import random_speaker

    ref = np.load(FIXTURES / "speakers.npz")
    for seed, want in zip(ref["seeds"].tolist(), ref["random"]):
        got = random_speaker(seed, want.shape[0], ref["stats"])
        assert np.array_equal(got, want.astype(np.float32)), seed
    assert not np.array_equal(random_speaker(0, 768), ref["random"][0].astype(np.float32))   # the statistics matter


@pytest.fixture(scope="module")
def greedy_ref():
    return np.load(FIXTURES / "greedy.npz")


def cases(ref) -> list[tuple[str, str, bool]]:
    return [(f"{n}_{k}", text, k == "spk") for n, text in enumerate(ref["texts"].tolist()) for k in ("none", "spk")]


def test_prompt_ids_equal_the_references(demo, greedy_ref):
    """[Stts][spk_emb|empty_spk][speed_5]{text}[Ptts], tokenized as the reference does (texts its
    normaliser leaves as they are)."""
    from velocity.tts.frontend import TextFrontend

    fe = TextFrontend(demo)
    for key, text, spk in cases(greedy_ref):
        sentences, _ = fe.encode(text, speaker=spk)
        assert [s.token_ids for s in sentences] == [greedy_ref[f"prompt_{key}"].tolist()], key


def test_greedy_frames_equal_the_references(demo, greedy_ref):
    """Our greedy (temperature 0) against the reference's argmax (temperature 1e-6), repetition
    penalty 1.05 on both, with and without a speaker: the same frames."""
    from velocity import LLM, SamplingParams
    from velocity.tts.speaker import decode_speaker

    llm = LLM(model=str(demo), device="cpu")
    speaker = decode_speaker(str(greedy_ref["speaker"]), llm.engine.worker.model.config.hidden_size)
    keys = [k for k, _, _ in cases(greedy_ref)]
    want = [greedy_ref[f"frames_{k}"] for k in keys]
    outs = llm.generate(prompt_token_ids=[greedy_ref[f"prompt_{k}"].tolist() for k in keys],
                        sampling_params=SamplingParams(temperature=0, top_p=0.7, top_k=20, repetition_penalty=1.05,
                                                       max_new_tokens=len(want[0])),
                        speakers=[speaker if s else None for _, _, s in cases(greedy_ref)])
    for k, out, w in zip(keys, outs, want):
        assert [list(f) for f in out.token_ids] == w.tolist(), k


def test_greedy_hidden_states_equal_the_references(demo, greedy_ref):
    """The hidden state that sampled each frame (what the Decoder path decodes). Not bit-exact:
    our attention and matmuls sum in another order than transformers' (float32 rounding, about
    1e-6 of the values' scale); 1e-4 relative to the largest value."""
    from velocity import LLM, SamplingParams
    from velocity.tts.speaker import decode_speaker

    llm = LLM(model=str(demo), device="cpu")
    speaker = decode_speaker(str(greedy_ref["speaker"]), llm.engine.worker.model.config.hidden_size)
    keys = [k for k, _, _ in cases(greedy_ref)]
    outs = llm.generate(prompt_token_ids=[greedy_ref[f"prompt_{k}"].tolist() for k in keys],
                        sampling_params=SamplingParams(temperature=0, top_p=0.7, top_k=20, repetition_penalty=1.05,
                                                       max_new_tokens=len(greedy_ref[f"frames_{keys[0]}"])),
                        speakers=[speaker if s else None for _, _, s in cases(greedy_ref)], return_hidden=True)
    for k, out in zip(keys, outs):
        want = greedy_ref[f"hidden_{k}"]
        assert out.hidden.shape == want.shape, k
        np.testing.assert_allclose(out.hidden, want, rtol=0, atol=1e-4 * np.abs(want).max(), err_msg=k)


@pytest.mark.parametrize("decoder", ["hidden", "codes"])
def test_text_to_speech_equals_the_reference(demo, greedy_ref, decoder):
    """Text -> greedy frames -> streamed decode (exact context, small chunks so that a text makes
    several, and seams fall inside it) against the reference's whole decode of the same text
    (Chat._decode_to_wavs, use_decoder=True for "hidden"): the same length, >= 100 dB SNR."""
    from velocity.tts.pipeline import TTSPipeline, chattts_params
    from velocity.tts.chunking import ChunkSchedule

    pipe = TTSPipeline(demo, device="cpu", schedule=ChunkSchedule(4, 8))
    frames = len(greedy_ref[f"frames_{cases(greedy_ref)[0][0]}"])
    for key, text, spk in cases(greedy_ref):
        chunks = list(pipe.stream(text, speaker=str(greedy_ref["speaker"]) if spk else None, decoder=decoder,
                                  params=chattts_params(temperature=0, max_new_tokens=frames)))
        assert len(chunks) > 3, key
        wav = np.concatenate([c.audio for c in chunks])
        want = greedy_ref[f"wav_{decoder}_{key}"]
        assert wav.shape == want.shape == (512 * frames - 256,), key
        assert snr_db(want, wav) >= 100, (key, snr_db(want, wav))


def test_every_frontend_fixture_text_gives_the_references_prompt_ids(tmp_path):
    """Texts of punctuation, apostrophes, question marks, brackets, both languages and split
    points (frontend.npz): the same pieces and the same prompt ids as the reference's text path
    (Chat.infer's split, its normaliser, homophones, prompt template), on the full demo's tokenizer."""
    from velocity.demo.checkpoint import write_tokenizer
    from velocity.tts.frontend import TextFrontend

    ref = np.load(FIXTURES / "frontend.npz")
    write_tokenizer(tmp_path / "asset" / "tokenizer", int(ref["vocab"]))
    fe = TextFrontend(tmp_path)
    want = np.split(ref["ids"], np.cumsum(ref["lengths"])[:-1])
    at = 0
    for text, n in zip(ref["texts"].tolist(), ref["pieces"].tolist()):
        got = [s.token_ids for s in fe.encode(text, speaker=False)[0]]
        assert got == [w.tolist() for w in want[at:at + n]], (text, [fe.tokenizer.decode(g) for g in got],
                                                               [fe.tokenizer.decode(w) for w in want[at:at + n]])
        at += n


def test_traditional_chinese_is_read_as_the_reference_reads_it(tmp_path):
    """Traditional texts (traditional.npz): every traditional character is replaced before the GPT
    sees it, as in the reference, although the vocabulary has it (後 -> 后, 來 -> 来). The same pieces
    and prompt ids, but where the reference's homophone map picks a character other than the
    simplified form (時 -> 石; 9 of the 91 ids here, measured): there ours is OpenCC's simplified form and
    reads the same (pypinyin, with tone). The map is the reference's data (AGPL), not ours to copy."""
    import opencc
    from pypinyin import Style, pinyin

    from velocity.demo.checkpoint import write_tokenizer
    from velocity.tts.frontend import TextFrontend

    t2s = opencc.OpenCC("t2s").convert
    ref = np.load(FIXTURES / "traditional.npz")
    write_tokenizer(tmp_path / "asset" / "tokenizer", int(ref["vocab"]))
    fe = TextFrontend(tmp_path)
    tok = fe.tokenizer
    want = np.split(ref["ids"], np.cumsum(ref["lengths"])[:-1])
    at, same, homophone = 0, 0, []
    for text, n in zip(ref["texts"].tolist(), ref["pieces"].tolist()):
        got = [s.token_ids for s in fe.encode(text, speaker=False)[0]]
        assert len(got) == n, text
        spoken = "".join(tok.tokens([i for g in got for i in g]))
        assert all(t2s(c) == c for c in spoken), (text, spoken)         # nothing traditional reaches the GPT
        for g, w in zip(got, want[at:at + n]):
            assert len(g) == len(w), (text, tok.decode(g), tok.decode(w))
            for a, b in zip(g, w.tolist()):
                if a == b:
                    same += 1
                    continue
                ours, theirs = tok.tokens([a, b])
                read = [pinyin(c, style=Style.TONE3)[0][0] for c in (ours, theirs)]
                assert read[0] == read[1], (text, ours, theirs, read)       # a homophone: the same reading
                homophone.append(ours + theirs)
        at += n
    print(f"{same} ids the same, {len(homophone)} homophones (ours, the reference's): {homophone}")
    assert "时石" in homophone and same >= 8 * len(homophone), (same, homophone)


@pytest.fixture(scope="module")
def voice_ref():
    return np.load(FIXTURES / "voice.npz")


def test_voice_sample_mel_and_codes_equal_the_references(demo, voice_ref):
    """Chat.sample_audio_speaker on the same weights and audio: the log-mel (the file's window and
    filter bank through a centred magnitude STFT) within 1e-5 of its peak, and the encoder's
    codes bit for bit. The mel's tolerance is the CPU's, not ours: on one machine ours equals
    the reference's bit for bit (checked on an Intel Xeon with scripts/conformance), but the
    reference itself on that Xeon and on the AMD EPYC that made the fixtures differs by up to
    1.6e-6 of the peak (7.6e-6 on 4.67): torch's vectorised STFT and log round differently per
    instruction set."""
    dvae = load_dvae(demo, encoder=True)
    for i in range(2):
        wave = torch.from_numpy(voice_ref[f"wave_{i}"])
        want = voice_ref[f"mel_{i}"]
        got = dvae.preprocessor_mel(wave).numpy()
        assert got.shape == want.shape, i
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max(), err_msg=str(i))
        codes = dvae.encode(wave)
        assert codes.shape == voice_ref[f"codes_{i}"].shape and np.array_equal(codes.numpy(), voice_ref[f"codes_{i}"]), i


def test_voice_sample_strings_are_the_references(voice_ref):
    """The sample string (shape, uint16 codes, raw LZMA2, base16384) is the reference's, both ways."""
    from velocity.tts.speaker import decode_sample, encode_sample
    for i in range(2):
        codes, want = voice_ref[f"codes_{i}"], str(voice_ref[f"string_{i}"])
        assert encode_sample(codes) == want
        assert np.array_equal(decode_sample(want, 4, 625, 4096), codes)


def test_the_demo_mel_filter_bank_is_torchaudios():
    """The demo writer's filter bank against torchaudio's melscale_fbanks(513, 0, 12000, 100, 24000),
    as the reference's MelSpectrogram builds it (the release's file holds torchaudio's). Tolerance
    2e-5 absolute on weights up to 1: the same triangles in float32 with a different order of
    operations (1.5e-5 measured); the mel front end itself reads the bank from the file."""
    from velocity.demo.audio_weights import mel_filterbank
    want = np.load(FIXTURES / "voice.npz")["torchaudio_fb"]
    got = mel_filterbank(1024, 100, 24000).numpy()
    assert got.shape == want.shape and np.abs(got - want).max() < 2e-5


@pytest.fixture(scope="module")
def cloned_ref():
    return np.load(FIXTURES / "cloned.npz")


def cloned_cases(ref) -> list[tuple[str, str, bool]]:
    return [(f"{n}_{s}", str(t), s == "spk") for n, t in enumerate(ref["texts"]) for s in ("none", "spk")]


def cloned_prompt(ref, key: str) -> list:
    """The fixture's prompt rows as engine tokens: text rows (they repeat the id), then the
    sample's frames, one per row of codes."""
    from velocity.tts.speaker import decode_sample
    rows = ref[f"prompt_{key}"].tolist()
    T = decode_sample(str(ref["sample"]), 4, 625, 4096).shape[1]
    return [r[0] for r in rows[:-T]] + [tuple(r) for r in rows[-T:]]


def test_prompts_with_a_voice_sample_equal_the_references(demo, cloned_ref):
    """[Stts][spk_emb|empty_spk]{sample text}{prompt}{text}[Ptts], then the sample's frames (decoded
    from the reference's own sample string): the reference's input rows, token for token."""
    from velocity.tts.frontend import TextFrontend
    from velocity.tts.speaker import decode_sample, sample_frames

    fe = TextFrontend(demo)
    frames = sample_frames(decode_sample(str(cloned_ref["sample"]), 4, 625, 4096))
    for key, text, spk in cloned_cases(cloned_ref):
        sentences, _ = fe.encode(text, speaker=spk, sample_text=str(cloned_ref["sample_text"]))
        rows = [[t] * 4 for t in sentences[0].token_ids] + [list(f) for f in frames]
        assert len(sentences) == 1 and rows == cloned_ref[f"prompt_{key}"].tolist(), key


def test_greedy_frames_with_a_voice_sample_equal_the_references(demo, cloned_ref):
    """The engine continues a prompt that ends in the sample's audio frames: the reference's argmax
    frames exactly, hidden states within 1e-4 of the largest (as without a sample)."""
    from velocity import LLM, SamplingParams
    from velocity.tts.speaker import decode_speaker

    llm = LLM(model=str(demo), device="cpu")
    speaker = decode_speaker(str(cloned_ref["speaker"]), llm.engine.worker.model.config.hidden_size)
    keys = [k for k, _, _ in cloned_cases(cloned_ref)]
    prompts = [cloned_prompt(cloned_ref, k) for k in keys]
    assert all(isinstance(p[-1], tuple) and isinstance(p[0], int) for p in prompts)
    outs = llm.generate(prompt_token_ids=prompts,
                        sampling_params=SamplingParams(temperature=0, top_p=0.7, top_k=20, repetition_penalty=1.05,
                                                       max_new_tokens=len(cloned_ref[f"frames_{keys[0]}"])),
                        speakers=[speaker if s else None for _, _, s in cloned_cases(cloned_ref)], return_hidden=True)
    for k, out in zip(keys, outs):
        assert [list(f) for f in out.token_ids] == cloned_ref[f"frames_{k}"].tolist(), k
        want = cloned_ref[f"hidden_{k}"]
        np.testing.assert_allclose(out.hidden, want, rtol=0, atol=1e-4 * np.abs(want).max(), err_msg=k)


def test_the_pipeline_with_a_voice_sample_speaks_the_references_frames(demo, cloned_ref):
    """TTSPipeline(sample=the reference's string, sample_text=...) greedy: the audio of the
    reference's frames (the same length; the codes path decodes them bit for bit as a whole)."""
    from velocity.tts.pipeline import TTSPipeline, chattts_params
    from velocity.tts.audio_decoder import AudioDecoder

    pipe = TTSPipeline(demo, device="cpu")
    key, text, _ = cloned_cases(cloned_ref)[0]
    want = cloned_ref[f"frames_{key}"]
    wav = pipe.synthesize(text, decoder="codes", sample=str(cloned_ref["sample"]),
                          sample_text=str(cloned_ref["sample_text"]),
                          params=chattts_params(temperature=0, max_new_tokens=len(want)))
    whole = AudioDecoder(load_dvae(demo), load_vocos(demo)).decode(torch.from_numpy(want.T[None].copy()))
    assert wav.shape == (512 * len(want) - 256,)
    assert snr_db(whole[0].numpy()[:len(wav)], wav) >= 100


@pytest.fixture(scope="module")
def refine_ref():
    return np.load(FIXTURES / "refine.npz")


def refine_cases(ref) -> list[tuple[str, str, str]]:
    return [(f"{n}_{m}", str(t), str(p)) for n, t in enumerate(ref["texts"]) for m, p in enumerate(ref["prompts"])]


def test_refine_prompts_text_and_audio_prompts_equal_the_references(demo, refine_ref):
    """[Sbreak]{text}[Pbreak]{prompt}; the generated ids below [break_0], decoded; and the audio
    prompt of that refined text (template tokens dropped, [Stts][empty_spk][speed_5]...[Ptts]):
    the reference's, token for token and character for character."""
    from velocity.tts.frontend import TextFrontend

    fe = TextFrontend(demo)
    prefix = fe.code_prefix(speaker=False)
    for key, text, prompt in refine_cases(refine_ref):
        assert fe.refine_prompt(text, prompt) == refine_ref[f"refine_prompt_{key}"].tolist(), key
        refined = fe.refined_text(refine_ref[f"generated_{key}"].tolist())
        assert refined == str(refine_ref[f"refined_{key}"]), key
        assert fe.refined_prompt(prefix, refined) == refine_ref[f"code_prompt_{key}"].tolist(), key


def test_greedy_refine_equals_the_references(demo, refine_ref):
    """The text head, greedy, on the refine prompts: the reference's argmax ids (temperature
    1e-6, its refine defaults otherwise: top-p 0.7, top-k 20, no repetition penalty)."""
    from velocity import LLM
    from velocity.sampling_params import refine_params

    llm = LLM(model=str(demo), device="cpu")
    cases = refine_cases(refine_ref)
    n = len(refine_ref[f"generated_{cases[0][0]}"])
    outs = llm.generate([refine_ref[f"refine_prompt_{k}"].tolist() for k, _, _ in cases],
                        refine_params(temperature=0, max_new_tokens=n), head="text")
    for (key, _, _), out in zip(cases, outs):
        assert out.token_ids == refine_ref[f"generated_{key}"].tolist(), key


def test_the_pipeline_refines_then_speaks_the_refined_texts_prompt(demo, refine_ref):
    """TTSPipeline(refine=...) greedy: the first chunk carries the reference's refined text, and
    the audio is that of greedy frames from the reference's audio prompt for it."""
    from velocity import LLM, SamplingParams
    from velocity.tts.pipeline import TTSPipeline, chattts_params, refine_params
    from velocity.tts.audio_decoder import AudioDecoder

    key, text, prompt = refine_cases(refine_ref)[1]
    pipe = TTSPipeline(demo, device="cpu")
    n = len(refine_ref[f"generated_{key}"])
    chunks = list(pipe.stream(text, decoder="codes", params=chattts_params(temperature=0, max_new_tokens=12),
                              refine=refine_params(temperature=0, max_new_tokens=n), refine_prompt=prompt))
    assert chunks[0].text == str(refine_ref[f"refined_{key}"]) and all(not c.text for c in chunks[1:])
    frames = LLM(model=str(demo), device="cpu").generate(
        [refine_ref[f"code_prompt_{key}"].tolist()], SamplingParams(temperature=0, top_p=0.7, top_k=20,
                                                                     repetition_penalty=1.05, max_new_tokens=12))[0]
    codes = torch.tensor([list(f) for f in frames.token_ids if 625 not in f]).T[None]
    whole = AudioDecoder(load_dvae(demo), load_vocos(demo)).decode(codes)[0].numpy()
    wav = np.concatenate([c.audio for c in chunks])
    assert wav.shape == (512 * codes.shape[-1] - 256,) and snr_db(whole[:len(wav)], wav) >= 100


@pytest.fixture(scope="module")
def carried_ref():
    return np.load(FIXTURES / "carried.npz")


def test_voice_carry_over_makes_the_references_sample_frames_and_audio(demo, carried_ref):
    """The reference's voice carry-over (carried.npz: Chat.infer on a text of several pieces, no
    sample, near-greedy), through TTSPipeline(carry_over=True):
    - the voice sample made of the first sentence's audio: the frames of the sample string that
      infer() set, bit for bit;
    - every sentence, the first again, then spoken with it: the reference's frames exactly (the
      engine's own requests, replayed);
    - the audio: the reference's within 100 dB SNR (the hidden-state path's float rounding, as
      without carry-over), after infer()'s own trimming (it drops every sample within 1e-5 of
      zero), where its pieces were of one length. Where they were not, infer() decoded the
      shorter one padded with zero hidden states and kept that padding's audio: the reference's
      audio is longer than its frames make, ours is exactly theirs.
    Without carry-over the audio is another voice's."""
    from velocity import LLM, SamplingParams
    from velocity.tts.carry_over import VoiceCarrier
    from velocity.tts.pipeline import TTSPipeline, chattts_params
    from velocity.tts.speaker import decode_sample, decode_speaker, sample_frames

    pipe = TTSPipeline(demo, device="cpu")
    llm = LLM(model=str(demo), device="cpu")
    add, made, prompts = pipe.engine.add_request, [], []       # the engine's requests, and the samples made
    pipe.engine.add_request = lambda rid, prompt, *a, **k: prompts.append(prompt) or add(rid, prompt, *a, **k)
    pipe._carrier = carrier = VoiceCarrier.load(demo, pipe.decoder)
    sample = carrier.sample
    carrier.sample = lambda frames, hidden: made.append(sample(frames, hidden)) or made[-1]
    for n, text in enumerate(carried_ref["texts"].tolist()):
        for spk in ("none", "spk"):
            key = f"{n}_{spk}"
            speaker = str(carried_ref["speaker"]) if spk == "spk" else None
            want_frames = [carried_ref[f"frames_{key}_{i}"] for i in range(3) if f"frames_{key}_{i}" in carried_ref]
            params = chattts_params(temperature=0, max_new_tokens=len(want_frames[0]))
            prompts.clear()
            wav = np.concatenate([c.audio for c in pipe.stream(text, speaker=speaker, params=params, carry_over=True)])
            want_sample = sample_frames(decode_sample(str(carried_ref[f"sample_{key}"]), 4, 625, 4096))
            assert made.pop() == want_sample and not made, key
            carried = [p for p in prompts if isinstance(p[-1], tuple)]   # the first pass's prompt has no sample
            assert len(prompts) == 1 + len(want_frames) and len(carried) == len(want_frames), key
            assert all(p[-len(want_sample):] == want_sample for p in carried), key
            vec = None if speaker is None else decode_speaker(speaker, llm.engine.worker.model.config.hidden_size)
            outs = llm.generate(prompt_token_ids=carried, sampling_params=SamplingParams(
                temperature=0, top_p=0.7, top_k=20, repetition_penalty=1.05, max_new_tokens=len(want_frames[0])),
                speakers=[vec] * len(carried))
            got = [[list(f) for f in o.token_ids if 625 not in f] for o in outs]
            assert got == [w.tolist() for w in want_frames], key
            assert wav.shape == (sum(512 * len(f) - 256 for f in want_frames),), key
            want, wav = carried_ref[f"wav_{key}"], wav[np.abs(wav) > 1e-5]
            if len({len(f) for f in want_frames}) == 1:
                assert wav.shape == want.shape and snr_db(want, wav) >= 100, (key, wav.shape, want.shape)
                plain = np.concatenate([c.audio for c in pipe.stream(text, speaker=speaker, params=params)])
                plain = plain[np.abs(plain) > 1e-5]
                assert plain.shape != want.shape or snr_db(want, plain) < 20, key
            else:
                assert len(want) > sum(512 * len(f) - 256 for f in want_frames) > len(wav), key
