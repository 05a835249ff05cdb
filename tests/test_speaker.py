"""Speaker strings: float16 bytes, raw LZMA2 (preset 9 | extreme), base16384."""
import lzma

import numpy as np
import pybase16384 as b14
import pytest

from velocity.tts.speaker import SpeakerError, decode_speaker, encode_speaker, random_speaker


def test_round_trip_is_exact_in_float16():
    v = random_speaker(seed=5)
    back = decode_speaker(encode_speaker(v))
    assert back.shape == (768,) and back.dtype == np.float32
    np.testing.assert_array_equal(back, v.astype(np.float16).astype(np.float32))


def test_decodes_a_string_built_independently():
    v = np.linspace(-2, 2, 768).astype(np.float16)
    raw = lzma.compress(v.tobytes(), format=lzma.FORMAT_RAW,
                        filters=[{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}])
    s = b14.encode_to_string(raw)
    np.testing.assert_array_equal(decode_speaker(s), v.astype(np.float32))
    assert encode_speaker(v) == s     # same bytes as the release's encoder settings


def test_random_speaker_is_seeded():
    assert np.array_equal(random_speaker(1), random_speaker(1))
    assert not np.array_equal(random_speaker(1), random_speaker(2))
    np.testing.assert_allclose(random_speaker(1, mean=np.ones(768), std=np.full(768, 0.0)), np.ones(768))


@pytest.mark.parametrize("s,match", [
    ("", "empty"),
    ("not base16384 at all!", "LZMA2|base16384"),
    (encode_speaker(np.zeros(100)), "holds 100 float16 values, expected 768"),
    (encode_speaker(np.full(768, np.inf)), "NaN or inf"),
])
def test_malformed_strings_say_why(s, match):
    with pytest.raises(SpeakerError, match=match):
        decode_speaker(s)
