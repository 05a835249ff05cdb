"""The release's special tokens and the text vocabulary the demo checkpoints use."""
from __future__ import annotations

# Control and template tokens of the ChatTTS tokenizer (added, never split).
SPECIAL_TOKENS = (
    ["[Stts]", "[Ptts]", "[spk_emb]", "[empty_spk]", "[Sbreak]", "[Pbreak]", "[Ebreak]", "[uv_break]", "[v_break]",
     "[lbreak]", "[laugh]", "[music_start]", "[music_end]"]
    + [f"[speed_{i}]" for i in range(10)] + [f"[oral_{i}]" for i in range(10)]
    + [f"[laugh_{i}]" for i in range(3)] + [f"[break_{i}]" for i in range(8)]
)
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def demo_vocab(size: int) -> list[str]:
    """A WordPiece vocabulary of exactly `size` entries (BERT specials, ASCII, punctuation,
    CJK characters, then ## pieces), before the added special tokens."""
    base = BERT_SPECIALS + list("abcdefghijklmnopqrstuvwxyz0123456789") + list(",.!?;:'\"-()，。！？、；：“”")
    cjk = [chr(c) for c in range(0x4E00, 0x9FA6)]
    words = ["the", "and", "is", "to", "of", "a", "in", "it", "you", "that", "this", "speech", "hello", "world"]
    pieces = [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    vocab = list(dict.fromkeys(base + words + pieces + cjk))      # unique, in order
    if size > len(vocab):
        vocab += [f"##{c}" for c in cjk[: size - len(vocab)]]
    return vocab[:size]
