"""Text front end: normalisation table (English and Chinese), control tokens, sentences, prompt ids."""
from __future__ import annotations

import pytest

from checkpoints import tiny_checkpoint
from velocity.tts.frontend import TextFrontend
from velocity.tts.normalizer import Normalizer, detect_language, split_sentences, split_text

# (input, expected normalised text). Digits are always spoken, never dropped.
CASES = [
    # English: cardinals, decimals, negatives, big numbers
    ("I have 3 apples.", "I have three apples."),
    ("It costs 42 points.", "It costs forty two points."),
    ("Pi is 3.14", "Pi is three point one four"),
    ("It fell to -7 today", "It fell to minus seven today"),
    ("1,234,567 people", "one million two hundred and thirty four thousand five hundred and sixty seven people"),
    ("We need 0 excuses", "We need zero excuses"),
    ("Room 101 is free", "Room one hundred and one is free"),
    # ordinals
    ("She came 1st", "She came first"),
    ("the 2nd time", "the second time"),
    ("the 23rd floor", "the twenty third floor"),
    ("his 100th birthday", "his one hundredth birthday"),
    # years and dates
    ("Born in 1999.", "Born in nineteen ninety nine."),
    ("Since 2024 things changed", "Since twenty twenty four things changed"),
    ("On 2024-05-03 we met", "On May third, twenty twenty four we met"),
    # times
    ("Meet at 10:30", "Meet at ten thirty"),
    ("Wake at 7:05", "Wake at seven oh five"),
    ("Dinner at 6:00", "Dinner at six o clock"),
    ("Leave at 9:15 pm", "Leave at nine fifteen p m"),
    # currency and percentages
    ("It costs $5", "It costs five dollars"),
    ("Pay $12.50 now", "Pay twelve dollars fifty cents now"),
    ("About €3", "About three euros"),
    ("Up 50%", "Up fifty percent"),
    ("Down 2.5 %", "Down two point five percent"),
    # units
    ("Walk 5 km", "Walk five kilometers"),
    ("Only 1 km", "Only one kilometer"),
    ("Lift 20kg", "Lift twenty kilograms"),
    ("It was 30°C", "It was thirty degrees Celsius"),
    ("Drive 60 mph", "Drive sixty miles per hour"),
    # punctuation and symbols
    ("Really? Yes!", "Really Yes."),                       # the reference drops `?`, `!` ends a sentence
    ("A; B: C", "A, B, C"),
    ("salt & pepper", "salt and pepper"),
    # control tokens pass through, unknown ones are dropped (and reported)
    ("Hello [uv_break] there [laugh]", "Hello [uv_break] there [laugh]"),
    ("Slow [speed_2] down [oral_3] [break_4]", "Slow [speed_2] down [oral_3] [break_4]"),
    ("Hi [nonsense] you", "Hi you"),
    # Chinese: numbers, dates, percentages, money, times, units, punctuation
    ("我有3个苹果", "我有三个苹果"),
    ("今天是2024年5月3日", "今天是二零二四年五月三日"),
    ("气温-3.5度", "气温负三点五度"),
    ("增长了50%", "增长了百分之五十"),
    ("花了¥12", "花了十二元"),
    ("会议10:30开始", "会议十点三十分开始"),
    ("早上8:00出发", "早上八点整出发"),
    ("他跑了5km", "他跑了五公里"),
    ("体重70kg", "体重七十千克"),
    ("共1,200人", "共一千二百人"),
    ("第3名", "第三名"),
    ("真的吗？是的！", "真的吗是的。"),
    ("注意：安全", "注意，安全"),
    ("你好[laugh]世界[uv_break]", "你好[laugh]世界[uv_break]"),
]


@pytest.mark.parametrize("text,expected", CASES, ids=[c[0] for c in CASES])
def test_normalisation_table(text, expected):
    out = Normalizer().normalize(text)
    assert out.text == expected
    assert not any(ch.isdigit() for ch in out.text.replace("[speed_2]", "").replace("[oral_3]", "")
                   .replace("[break_4]", ""))


def test_table_covers_both_languages():
    langs = [detect_language(t) for t, _ in CASES]
    assert len(CASES) >= 40 and langs.count("en") >= 20 and langs.count("zh") >= 12


def test_unknown_tokens_are_reported_and_unencodable_characters_counted():
    n = Normalizer(replace=lambda ch: "" if ch == "丑" else ch)
    out = n.normalize("Café [robot] ok ♪ 丑")
    assert out.unknown_tokens == ["[robot]"]
    assert out.text == "Caf ok" and out.removed == 3      # é (not ASCII), ♪, and 丑 (no replacement)


def test_texts_split_as_the_reference_then_long_pieces_at_commas():
    assert split_text("Hello there. How are you? Pi is 3.5 exactly.") == ["Hello there. ", "How are you? Pi is 3.5 exactly."]
    assert split_text("你好。我很好！再见") == ["你好。", "我很好！再见"]
    assert split_text("One. Two\n\n三。四") == ["One. Two", "三。四"]         # newlines win
    long = "，".join(["一二三四五六七八九十"] * 30)
    parts = split_sentences(long, max_chars=50)
    assert all(len(p) <= 50 for p in parts) and "".join(parts) == long


def test_characters_the_tokenizer_lacks_become_ones_it_has():
    """Traditional -> simplified (OpenCC) when the vocabulary has the simplified one, even where it
    has the traditional one too (as the reference, which never feeds the GPT 後); else the
    character itself if the vocabulary has it; else one of the same pinyin and tone (pypinyin)
    that it has, else dropped."""
    from velocity.tts.homophones import Homophones
    vocab = {"们": 5, "他": 7, "塔": 9, "好": 11, "後": 12, "后": 13, "來": 14}
    h = Homophones(vocab)
    assert [h(c) for c in "們她他好丑"] == ["们", "他", "他", "好", ""]      # 她 ta1 -> 他 (lower id than 塔, ta3 anyway)
    assert [h(c) for c in "後來"] == ["后", "來"]          # 来 is not in this vocabulary: 來 stays


@pytest.fixture(scope="module")
def frontend(tmp_path_factory):
    return TextFrontend(tiny_checkpoint(tmp_path_factory.mktemp("fe") / "tiny"))


def test_prompt_template_and_ids(frontend):
    tok = frontend.tokenizer
    sents, norm = frontend.encode("Hello world. 2 apples!", speaker=True)
    assert [s.text for s in sents] == ["Hello world.", "two apples."]
    ids = sents[0].token_ids
    assert tok.tokens(ids[:3]) == ["[Stts]", "[spk_emb]", "[speed_5]"]
    assert tok.tokens(ids[-1:]) == ["[Ptts]"]
    assert tok.decode(ids[3:-1]).replace(" ", "") == "helloworld."
    no_spk, _ = frontend.encode("Hi there", speaker=False, prompt="[oral_2][speed_3]")
    assert tok.tokens(no_spk[0].token_ids[:4]) == ["[Stts]", "[empty_spk]", "[oral_2]", "[speed_3]"]
    assert tok.get_vocab()["[UNK]"] not in ids


def test_bad_prompt_and_empty_text(frontend):
    with pytest.raises(ValueError, match="PROMPT must hold only control tokens"):
        frontend.encode("hello", speaker=False, prompt="say this")
    assert frontend.encode("  [laugh] ...", speaker=False)[0] == []


def test_money_beyond_what_a_float_holds_is_read_as_a_number_and_its_currency():
    """hypothesis found "€99999999999999996174794753" raising inside num2words (decimal.InvalidOperation)."""
    from velocity.tts.normalizer import normalize_en
    out = normalize_en("€99999999999999996174794753")
    assert out.startswith("ninety nine septillion") and out.endswith("fifty three euros")
    assert normalize_en("£3,000,000,000,000,000") == "three quadrillion pounds"
