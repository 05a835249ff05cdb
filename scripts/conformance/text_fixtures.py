"""The reference's speaker and text-front-end fixtures (run by make_fixtures.py in .refvenv):
speaker strings and random speakers (speakers.npz), prompt ids of a set of texts (frontend.npz)
and of traditional-Chinese texts (traditional.npz)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch


@torch.inference_mode()
def speakers() -> dict[str, np.ndarray]:
    """What Speaker.apply writes at the [spk_emb] position, for speaker strings of several scales
    and one the reference samples itself (sample_random_speaker's way)."""
    from ChatTTS.config import Config
    from ChatTTS.model.speaker import Speaker

    from velocity.tts.speaker import encode_speaker

    c = Config()
    spk = Speaker(c.gpt.hidden_size, c.spk_stat)
    rng = np.random.default_rng(7)
    torch.manual_seed(7)
    strings = [encode_speaker(rng.standard_normal(c.gpt.hidden_size) * s) for s in (1.0, 0.003, 40.0)]
    strings.append(spk.sample_random())
    rows = []
    for s in strings:
        emb = torch.zeros(1, 3, c.gpt.hidden_size)
        ids = torch.tensor([[[1] * 4, [5] * 4, [2] * 4]])            # 5 plays [spk_emb]'s id
        rows.append(spk.apply(emb, s, ids, 5, torch.device("cpu"))[0, 1].numpy().copy())
    # random speakers from given statistics (seeded here, not the release's): the reference's
    # Speaker built on them, torch.manual_seed(seed), then its draw
    import pybase16384 as b14
    g = np.random.default_rng(11)
    dim = c.gpt.hidden_size
    stats = np.stack([0.5 + g.random(dim), 0.3 * g.standard_normal(dim)]).astype(np.float16)
    seeded = Speaker(dim, b14.encode_to_string(stats.tobytes()))
    seeds = [0, 1, 7, 123456789, 2**62 + 3]
    draws = []
    for seed in seeds:
        torch.manual_seed(seed)
        draws.append(seeded._sample_random().numpy().copy())
    return {"strings": np.array(strings), "rows": np.stack(rows), "stats": stats, "seeds": np.array(seeds, np.int64),
            "random": np.stack(draws)}


# Texts whose every character the reference defines (no digits: it drops them, we read them):
# punctuation, apostrophes, question marks, brackets, both languages, mixed, split points
FRONTEND_TEXTS = [
    "Really? Yes! It's fine.", "Hello: world; one (two) <three> four-five.", "Don't stop. Keep going, please.",
    "What is this? I do not know!", "salt and pepper, “quoted” words — dash", "e.g. this. And that.",
    "你好，世界！今天天气很好。", "真的吗？是的！", "注意：安全第一；请（小心）。", "他说「你好」，我说《再见》。",
    "我们一起去吧。明天见。", "Hello 你好，世界。", "你好 hello world again", "第一行\n第二行！\n",
    "我喜欢apple和banana。", "A-B-C, 一、二、三。",
]
FRONTEND_VOCAB = 21178       # the full demo's vocabulary: every CJK ideograph U+4E00-U+9FA5


# Traditional Chinese as a new user would write it: the reference replaces every traditional
# character (its homophone map), mostly by the simplified form, sometimes by another homophone
TRADITIONAL_TEXTS = [
    "他後來會來，時間不多了。", "我們為什麼還沒有聽說過這個消息？", "這裡的風景很漂亮，歡迎來臺灣！",
    "請問圖書館怎麼走？謝謝你的幫助。", "電腦與網絡讓世界變得更小了。",
]


def frontend(texts: list[str] = FRONTEND_TEXTS) -> dict[str, np.ndarray]:
    """The reference's text path for each text: infer()'s split, Normalizer (text normalisation and
    homophones), decorate_code_prompts, its tokenizer; the prompt ids of every piece (no speaker,
    [speed_5]). On the full demo's tokenizer, written by our writer."""
    import re

    import ChatTTS
    from ChatTTS.model.speaker import Speaker
    from ChatTTS.model.tokenizer import Tokenizer

    from velocity.demo.checkpoint import write_tokenizer

    chat = ChatTTS.Chat()
    ids, pieces = [], []
    with tempfile.TemporaryDirectory() as tmp:
        write_tokenizer(Path(tmp), FRONTEND_VOCAB)
        tok = Tokenizer(tmp)
        for text in texts:
            parts = text.split("\n") if "\n" in text else re.split(r"(?<=。)|(?<=\.\s)", text)   # Chat.infer's split
            parts = [chat.normalizer(p, True, True) for p in parts if p]
            prompts = Speaker.decorate_code_prompts(parts, "[speed_5]", None, None)
            for p in prompts:
                ids.append(tok.encode([p], 4)[0][0, :, 0].numpy())
            pieces.append(len(prompts))
    return {"texts": np.array(texts), "pieces": np.array(pieces), "lengths": np.array([len(i) for i in ids]),
            "ids": np.concatenate(ids), "vocab": np.array(FRONTEND_VOCAB)}
