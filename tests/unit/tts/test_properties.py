"""Property-based tests (hypothesis): the front end and request validation never let an
exception escape on arbitrary input, and what they produce is always tokenizable."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from velocity.serving.wire.input_table import PARAM_INPUTS
from velocity.serving.front.tts_request import TTSFront, parse_tts_request
from velocity.tts.voices import Voices
from velocity.serving.settings import Settings
from checkpoints import tiny_checkpoint
from velocity.tts.frontend import TextFrontend
from velocity.tts.speaker import SpeakerError, decode_speaker

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def frontend(tmp_path_factory):
    return TextFrontend(tiny_checkpoint(tmp_path_factory.mktemp("p") / "tiny", seed=0))


pieces = st.one_of(
    st.text(max_size=40),                                                       # any Unicode, controls included
    st.integers(min_value=-10**40, max_value=10**40).map(str),                  # huge numbers
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["[", "]", "[[", "]]", "[uv_break]", "[laugh]", "[speed_5]", "[oral_9]", "[break_", "[x]",
                     "[[laugh]]", "[unknown_token]", "$", "%", "°C", "km", "¥", "€", "12:30", "2024-02-30", "3.14.15",
                     "1st", "第3", "百分之", "。", "！", "?", "…", "\n", "\t", "\x00", "\u200b", "🙂", "é", "ß"]),
    st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), max_size=10),   # CJK
)
texts = st.lists(pieces, max_size=12).map("".join)


@PROPS
@given(text=texts)
def test_front_end_never_raises_and_output_is_tokenizable(frontend, text):
    sentences, report = frontend.encode(text, speaker=bool(len(text) % 2))
    vocab = frontend.tokenizer.get_vocab()
    for s in sentences:
        assert s.token_ids[0] == vocab["[Stts]"] and s.token_ids[-1] == vocab["[Ptts]"]
        assert all(0 <= i < len(vocab) for i in s.token_ids)
        assert vocab["[UNK]"] not in s.token_ids, (text, s.text, frontend.tokenizer.decode(s.token_ids))
    assert report.removed >= 0


def tensor(v):
    return None if v is None else np.asarray(v)


values = st.one_of(st.none(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                   st.text(max_size=5), st.binary(max_size=5), st.lists(st.floats(), max_size=3))


@PROPS
@given(text=st.one_of(st.none(), texts, st.binary(max_size=30)), prompt=st.one_of(st.none(), texts),
       speaker=st.one_of(st.none(), st.text(max_size=30)), params=st.fixed_dictionaries({n: values for n in PARAM_INPUTS}))
def test_request_validation_raises_only_value_errors(frontend, text, prompt, speaker, params):
    raw = {"TEXT": text, "PROMPT": prompt, "SPEAKER": speaker, **params}

    def get(name):
        v = raw.get(name)
        if v is None:
            return None
        if isinstance(v, (str, bytes)):
            return np.array([[v.encode() if isinstance(v, str) else v]], dtype=object)
        return np.asarray(v)

    try:
        req = parse_tts_request(get, TTSFront(Settings(max_text_chars=200, max_new_tokens=500), frontend, None,
                                              Voices("/nonexistent", frontend.speaker_dim, frontend.speaker_stats)))
    except ValueError as e:
        assert str(e)      # a message for the client
        return
    p = req.params
    assert p.temperature >= 0 and 0 < p.top_p <= 1 and p.top_k >= 0 and 1 <= p.max_new_tokens <= 500
    assert req.sentences


@PROPS
@given(s=st.text(max_size=60))
def test_malformed_speaker_strings_raise_speaker_error(s):
    try:
        v = decode_speaker(s, 64)
    except SpeakerError:
        return
    assert v.shape == (64,) and np.isfinite(v).all()


words = st.lists(st.one_of(st.text(alphabet="abcdefghij", min_size=1, max_size=12),
                           st.sampled_from(["[uv_break]", "[laugh]", "[speed_5]", "[v_break]"])), max_size=60)


@PROPS
@given(ws=words)
def test_long_sentences_split_between_words_never_inside_control_tokens(ws):
    from velocity.tts.normalizer import split_sentences

    pieces = split_sentences(" ".join(ws), max_chars=40)
    assert " ".join(pieces).split() == " ".join(ws).split()      # nothing lost, no word cut in two
