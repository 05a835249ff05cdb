"""SSML on the real server: each element spoken as the plain request it stands for, breaks as exact
silence, and bad markup refused by name and place."""
from __future__ import annotations

import re

import numpy as np
import pytest

from client.triton import ServerError, stream_grpc
from triton_server import assert_same_audio


pytestmark = pytest.mark.server


def ssml_audio(server, text: str, marks: list | None = None, **values) -> np.ndarray:
    base = {"SEED": 6, "MAX_NEW_TOKENS": 30}
    return np.concatenate([a for _, a in stream_grpc(server.grpc_url, base | values | {"TEXT": text}, marks=marks)])


@pytest.mark.parametrize("ssml,plain", [
    ('<speak><prosody rate="slow">Hello there.</prosody></speak>', {"TEXT": "Hello there.", "PROMPT": "[speed_3]"}),
    ('<speak>Hello <sub alias="world">WWW</sub>.</speak>', {"TEXT": "Hello world."}),
    ('<speak>Spell <say-as interpret-as="characters">abc</say-as>.</speak>', {"TEXT": "Spell a b c."}),
    ('<speak><voice name="basil">Hi there.</voice></speak>', {"TEXT": "Hi there.", "VOICE": "basil"}),
], ids=["prosody", "sub", "say-as", "voice"])
def test_ssml_speaks_as_the_text_it_stands_for(server, ssml, plain):
    """SSML=true: each element is spoken as the plain request it stands for, to the sample."""
    rest = {k: v for k, v in plain.items() if k != "TEXT"}
    assert_same_audio(ssml_audio(server, ssml, SSML=True), ssml_audio(server, plain["TEXT"], **rest))


def test_an_ssml_break_is_exact_silence_counted_in_the_offsets_and_the_words(server):
    """A 500 ms break between two sentences is 12000 zero samples before the second's audio, one
    at the end is silence after the last; the sample offsets count them, and the second
    sentence's words start after its silence."""
    marks: list = []
    text = '<speak>First one. <break time="500ms"/> Second one.<break time="1s"/></speak>'
    audio = ssml_audio(server, text, marks, SSML=True)
    first, second = ssml_audio(server, "First one."), ssml_audio(server, "Second one.")
    assert len(audio) == len(first) + 12000 + len(second) + 24000
    assert_same_audio(audio[:len(first)], first)
    assert not audio[len(first):len(first) + 12000].any() and not audio[-24000:].any()
    starts = [m[2] for m in marks]
    sizes = [len(a) for _, a in stream_grpc(server.grpc_url, {"TEXT": text, "SSML": True, "SEED": 6, "MAX_NEW_TOKENS": 30})]
    assert starts == [sum(sizes[:k]) for k in range(len(sizes))]
    words = [w for m in marks for w in m[4]]
    assert [w["word"] for w in words] == ["First", "one.", "Second", "one."]
    assert words[2]["start"] >= len(first) + 12000


@pytest.mark.parametrize("text,says", [
    ("<speak><emphasis>Hi</emphasis></speak>", "TEXT: SSML at line 1, column 8: <emphasis> is not supported"),
    ('<!DOCTYPE s [<!ENTITY x "y">]><speak>&x;</speak>', "TEXT: SSML may not declare a DTD"),
    ("<speak><voice name='clone'>Hi.</voice></speak>", "<voice name='clone'> is a voice cloned from a recording"),
    ("<speak><voice name='nobody'>Hi.</voice></speak>", "VOICE 'nobody' is not a voice here"),
])
def test_bad_ssml_is_invalid_arg_naming_the_element(server, text, says):
    with pytest.raises(ServerError, match=re.escape(says)):
        ssml_audio(server, text, SSML=True)
    ssml_audio(server, "Still fine.")                            # and the server goes on
