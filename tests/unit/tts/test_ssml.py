"""The SSML subset (velocity.tts.ssml) as the front end reads it: blocks with their speed, voice
and silence, the words as written with the markup's readings, and every refusal naming the
element and its place."""
from __future__ import annotations

import pytest

from velocity.tts.ssml import SHORT_BREAK_MS, is_ssml, parse


def test_blocks_carry_speed_voice_and_silence():
    doc = parse('<speak>Hi <break time="100ms"/> there. <break time="800ms"/>'
                '<p><prosody rate="slow">Slow here.</prosody> Then <sub alias="World Wide Web">WWW</sub>, '
                'call <say-as interpret-as="telephone">555-1234</say-as>.</p>'
                '<voice name="basil">Number <say-as interpret-as="ordinal">3</say-as>.</voice>'
                '<break strength="strong"/></speak>')
    b = doc.blocks
    assert b[0].said.split() == ["Hi", "[uv_break]", "there."] and b[0].pause == 0
    assert (b[1].said.strip(), b[1].speed, b[1].pause) == ("Slow here.", 3, 800)
    assert "World Wide Web" in b[2].said and "5 5 5; 1 2 3 4" in b[2].said and b[2].speed is None
    assert [w for w, _ in b[2].words] == ["Then", "WWW,", "call", "555-1234."]
    assert dict(b[2].words)["WWW,"] == "World Wide Web,"
    assert (b[3].voice, b[3].said.strip(), doc.tail) == ("basil", "Number third.", 700)
    assert doc.text.split() == ["Hi", "there.", "Slow", "here.", "Then", "WWW,", "call", "555-1234.", "Number", "3."]


@pytest.mark.parametrize("rate,speed", [("x-slow", 1), ("fast", 7), ("50%", 3), ("200%", 7), ("100%", 5)])
def test_prosody_rates_are_chattts_speeds(rate, speed):
    assert parse(f'<speak><prosody rate="{rate}">Go.</prosody></speak>').blocks[0].speed == speed


def test_a_short_break_is_a_break_token_and_a_long_one_silence():
    short = parse(f'<speak>A <break time="{SHORT_BREAK_MS}ms"/> b.</speak>')
    assert len(short.blocks) == 1 and "[uv_break]" in short.blocks[0].said
    long = parse(f'<speak>A <break time="{SHORT_BREAK_MS + 1}ms"/> b.</speak>')
    assert [b.pause for b in long.blocks] == [0, SHORT_BREAK_MS + 1] and "[uv_break]" not in long.blocks[0].said


@pytest.mark.parametrize("text,says", [
    ("<speak><emphasis>x</emphasis></speak>", "line 1, column 8: <emphasis> is not supported"),
    ("<speak>\n  <audio src='x'/></speak>", "line 2, column 3: <audio> is not supported"),
    ("<speak>a <break time='20s'/> b</speak>", '<break time="20s"> is over 10 s'),
    ("<speak>a <break time='soon'/></speak>", "must be a duration such as 500ms"),
    ("<speak><prosody pitch='high'>x</prosody></speak>", "<prosody> has no attribute 'pitch'"),
    ("<speak><prosody rate='quick'>x</prosody></speak>", '<prosody rate="quick"> must be one of'),
    ("<speak>unclosed", "not well-formed XML at line 1"),
    ('<!DOCTYPE x [<!ENTITY a "b">]><speak>&a;</speak>', "may not declare a DTD, entities"),
    ('<?xml version="1.0"?><!DOCTYPE speak SYSTEM "http://example.com/x.dtd"><speak>x</speak>', "may not declare a DTD"),
    ("<p>x</p>", "SSML must start with <speak>, not <p>"),
    ("<speak><say-as interpret-as='cardinal'>abc</say-as></speak>", "must hold a whole number"),
    ("<speak><say-as interpret-as='verbatim'>abc</say-as></speak>", 'interpret-as="verbatim"> must be one of'),
    ("<speak><sub>x</sub></speak>", "<sub> needs an alias"),
    ("<speak><voice>x</voice></speak>", "<voice> needs a name"),
    ("<speak><sub alias='a'><s>x</s></sub></speak>", "<s> inside <sub>: it holds text only"),
    ("<speak>" + "<s>" * 40 + "x" + "</s>" * 40 + "</speak>", "nest deeper than 32"),
    ("<speak> <break time='1s'/> </speak>", "SSML has no text to speak"),
])
def test_what_is_outside_the_subset_is_refused_by_name_and_place(text, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        parse(text)


def test_only_a_text_that_starts_with_speak_is_ssml():
    assert is_ssml("  <speak>x</speak>") and not is_ssml("say <speak>") and not is_ssml("Hello.")


def test_the_front_end_speaks_each_block_with_its_prompt_and_times_the_written_words(tmp_path):
    from checkpoints import tiny_checkpoint
    from velocity.tts.frontend import TextFrontend

    front = TextFrontend(tiny_checkpoint(tmp_path / "tiny", seed=0))
    got, _ = front.encode('<speak>Hello <sub alias="world">WWW</sub>. <break time="1s"/>'
                          '<prosody rate="slow">Go slow.</prosody></speak>', speaker=True, ssml=True)
    plain, _ = front.encode("Hello world.", speaker=True)
    slow, _ = front.encode("Go slow.", speaker=True, prompt="[speed_3]")
    assert [s.token_ids for s in got] == [plain[0].token_ids, slow[0].token_ids]
    assert [s.pause for s in got] == [0, 1000] and got[0].words.words == [("Hello", "Hello"), ("WWW.", "world.")]
    assert got[1].words.rate < got[0].words.rate
