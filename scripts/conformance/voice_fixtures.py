"""The reference's voice fixtures (run by make_fixtures.py in .refvenv): voice samples
(Chat.sample_audio_speaker), generation with a sample (spk_smp, txt_smp) and text refine."""
from __future__ import annotations

import re

import numpy as np
import torch


def sample_waves() -> list[np.ndarray]:
    """Seeded 24 kHz test clips (a chirp in noise; 2 s, and an odd 1.3 s)."""
    rng, out = np.random.default_rng(77), []
    for seconds, f0 in ((2.0, 180.0), (1.3, 260.0)):
        t = np.arange(int(24000 * seconds)) / 24000
        wave = 0.3 * np.sin(2 * np.pi * (f0 + 150 * t) * t) + 0.05 * rng.standard_normal(t.shape)
        out.append(wave.astype(np.float32))
    return out


@torch.inference_mode()
def voice(mods: dict) -> dict[str, np.ndarray]:
    """What Chat.sample_audio_speaker does with each clip: mel, codes and the sample string."""
    import torchaudio
    from ChatTTS.model.speaker import Speaker

    dvae, out = mods["asset/DVAE.safetensors"], {}
    for i, wave in enumerate(sample_waves()):
        out[f"wave_{i}"] = wave
        out[f"mel_{i}"] = dvae.preprocessor_mel(torch.from_numpy(wave.copy())).numpy()
        codes = dvae.sample_audio(wave.copy())                    # = Chat.sample_audio_speaker before encoding
        out[f"codes_{i}"] = codes.numpy()
        out[f"string_{i}"] = np.array(Speaker.encode_prompt(codes))
    # the filter bank torchaudio builds for the reference's MelSpectrogram(24000, 1024, 256, 100)
    out["torchaudio_fb"] = torchaudio.functional.melscale_fbanks(513, 0.0, 12000.0, 100, 24000).numpy()
    return out


SAMPLE_TEXT = "this is the voice sample"


@torch.inference_mode()
def cloned(chat, sample: str, texts: list[str], frames: int) -> dict[str, np.ndarray]:
    """Chat._infer_code with spk_smp (a sample string) and txt_smp, as greedy() does without."""
    import ChatTTS

    from velocity.tts.speaker import encode_speaker

    speaker = encode_speaker(np.random.default_rng(3).standard_normal(chat.config.gpt.hidden_size))
    out: dict[str, np.ndarray] = {"texts": np.array(texts), "speaker": np.array(speaker),
                                  "sample": np.array(sample), "sample_text": np.array(SAMPLE_TEXT)}
    for n, text in enumerate(texts):
        for spk in (None, speaker):
            params = ChatTTS.Chat.InferCodeParams(temperature=1e-6, max_new_token=frames, spk_emb=spk,
                                                  spk_smp=sample, txt_smp=SAMPLE_TEXT, show_tqdm=False)
            ids, _, _ = chat.tokenizer.encode(
                chat.speaker.decorate_code_prompts([text], params.prompt, SAMPLE_TEXT, spk), chat.config.gpt.num_vq,
                prompt=chat.speaker.decode_prompt(sample))
            r = list(chat._infer_code([text], False, torch.device("cpu"), True, params))[-1]
            key = f"{n}_{'spk' if spk else 'none'}"
            out[f"prompt_{key}"] = ids[0].numpy()                # [L, num_vq]: text rows repeat the id
            out[f"frames_{key}"] = r.ids[0].numpy()
            out[f"hidden_{key}"] = r.hiddens[0].numpy()
    return out


REFINE_PROMPTS = ["", "[oral_2][laugh_0][break_6]"]     # the reference's default, and its README's
REFINE_TOKENS = 40


@torch.inference_mode()
def refine(chat, texts: list[str]) -> dict[str, np.ndarray]:
    """Chat.infer's refine step (normalised text -> text head -> ids below [break_0] -> decoded
    text), then the audio prompt the refined text makes (its _infer_code template)."""
    import ChatTTS

    out: dict[str, np.ndarray] = {"texts": np.array(texts), "prompts": np.array(REFINE_PROMPTS)}
    for n, text in enumerate(texts):
        for m, prompt in enumerate(REFINE_PROMPTS):
            params = ChatTTS.Chat.RefineTextParams(prompt=prompt, temperature=1e-6, max_new_token=REFINE_TOKENS,
                                                   show_tqdm=False)
            ids, _, _ = chat.tokenizer.encode(chat.speaker.decorate_text_prompts([text], prompt), chat.config.gpt.num_vq)
            r = chat._refine_text([text], torch.device("cpu"), params)
            kept = [i[i.less(chat.tokenizer.break_0_ids)] for i in r.ids]
            refined = chat.tokenizer.decode(kept)[0]
            code, _, _ = chat.tokenizer.encode(chat.speaker.decorate_code_prompts([refined], "[speed_5]", None, None),
                                               chat.config.gpt.num_vq)
            key = f"{n}_{m}"
            out[f"refine_prompt_{key}"] = ids[0, :, 0].numpy()
            out[f"generated_{key}"] = r.ids[0].numpy()
            out[f"refined_{key}"] = np.array(refined)
            out[f"code_prompt_{key}"] = code[0, :, 0].numpy()
    return out


CARRY_TEXTS = ["hello world. this is a test of the engine. the quick brown fox.",
               "one more time. and once again."]


@torch.inference_mode()
def carried(chat, frames: int) -> dict[str, np.ndarray]:
    """The reference's voice carry-over: Chat.infer on a text of several pieces without a sample
    (near-greedy, no refine) generates the first piece alone, makes a sample of its audio
    (Chat.sample_audio_speaker) and speaks every piece with it (spk_smp, txt_smp = the first
    piece). Recorded: the sample string and transcript infer() itself set in its params, each
    piece's frames and hidden states from the same _infer_code call infer() then makes, and
    infer()'s audio. With and without a speaker."""
    import ChatTTS

    from velocity.tts.speaker import encode_speaker

    speaker = encode_speaker(np.random.default_rng(5).standard_normal(chat.config.gpt.hidden_size))
    out: dict[str, np.ndarray] = {"texts": np.array(CARRY_TEXTS), "speaker": np.array(speaker)}
    for n, text in enumerate(CARRY_TEXTS):
        for spk in (None, speaker):
            key = f"{n}_{'spk' if spk else 'none'}"
            params = ChatTTS.Chat.InferCodeParams(temperature=1e-6, max_new_token=frames, spk_emb=spk, show_tqdm=False)
            wav = chat.infer(text, skip_refine_text=True, params_infer_code=params)[0]
            assert params.spk_smp is not None, "the reference did not carry the voice over"
            pieces = [chat.normalizer(p, True, True) for p in re.split(r"(?<=。)|(?<=\.\s)", text) if p]  # infer's
            r = list(chat._infer_code(pieces, False, torch.device("cpu"), True, params))[-1]
            out[f"sample_{key}"] = np.array(params.spk_smp)
            out[f"sample_text_{key}"] = np.array(params.txt_smp)
            out[f"wav_{key}"] = wav
            for i, (ids, hidden) in enumerate(zip(r.ids, r.hiddens)):
                out[f"frames_{key}_{i}"] = ids.numpy()
                out[f"hidden_{key}_{i}"] = hidden.float().numpy()
    return out
