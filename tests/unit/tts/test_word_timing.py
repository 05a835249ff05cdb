"""Word timing (velocity.tts.word_timing): the client's words found in what is spoken, shared out
to the sentences, and placed in a sentence's chunks as they go out: in order, each in the chunk
it is estimated to start in, never past the audio known when sent, all of them by the exact end."""
from __future__ import annotations

import pytest

from checkpoints import tiny_checkpoint
from velocity.tts.word_timing import (SentenceWords, WordClock, client_words, place_words, sentence_words,
                                      speaking_rate, syllables)


def test_the_words_are_the_clients_as_written():
    assert client_words("Hello, world! [uv_break] It's $5 — 你好，世界。用GPU跑") == \
        ["Hello,", "world!", "It's", "$5", "—", "你", "好，", "世", "界。", "用", "GPU", "跑"]


def test_syllables_and_rates():
    assert [syllables(w) for w in ("cat", "table", "make", "beautiful", "GPU", "你")] == [1, 2, 1, 3, 3, 1]
    assert speaking_rate("[speed_5]", "en") < speaking_rate("[speed_7]", "en")
    assert speaking_rate("[oral_2]", "en") == speaking_rate("[speed_5]", "en")


def test_a_word_not_found_shares_the_gap_of_its_neighbours():
    words = [("one", "one"), ("New", "new"), ("York", "york"), ("two", "two")]
    spans, total = place_words(words, "one nueva york, two.")
    assert spans[0] == (0.0, 1.0) and spans[2][0] >= spans[1][1] >= spans[1][0] >= spans[0][1]
    assert spans[3][0] > spans[2][1]                  # the comma's pause between them
    assert total > spans[3][1]                        # and the full stop's after


def test_the_words_go_to_the_sentences_that_speak_them():
    words = ["Hi,", "it", "is", "$5.", "Bye", "now."]
    readings = ["hi,", "it", "is", "five dollars.", "bye", "now."]
    assert sentence_words(words, readings, ["hi, it is five dollars.", "bye now."]) == [[0, 1, 2, 3], [4, 5]]
    assert sentence_words(["x", "Bye"], ["", "bye"], ["hi.", "bye."]) == [[0], [1]]


PLAN = SentenceWords([("Hello,", "hello,"), ("big", "big"), ("world.", "world.")], 4.0)
SPOKEN = "hello, big world."


def placed(clock, cuts, end):
    """Each chunk's words for chunks ending at `cuts` and then at the exact `end`."""
    out, start = [], 0
    for upto in cuts:
        out.append(clock.place(start, upto, upto + 2048, False))
        start = upto
    out.append(clock.place(start, end, end, True))
    return out


@pytest.mark.parametrize("end", [8000, 24000, 96000], ids=["faster", "as estimated", "slower"])
def test_a_sentence_places_every_word_once_in_order_within_its_audio(end):
    clock = WordClock(PLAN, SPOKEN, offset=1000)
    cuts = [c for c in (3000, 9000, 20000, 40000) if c < end]
    chunks = placed(clock, cuts, end)
    words = [w for c in chunks for w in c]
    assert [w.word for w in words] == ["Hello,", "big", "world."]
    bounds = [0] + cuts + [end]
    for k, chunk in enumerate(chunks):
        for w in chunk:
            assert 1000 + bounds[k] <= w.start <= w.end <= 1000 + end
            assert w.start < 1000 + bounds[k + 1] or k == len(chunks) - 1
    assert [w.start for w in words] == sorted(w.start for w in words)


def test_a_word_sent_keeps_its_time_and_ends_within_the_known_audio():
    clock = WordClock(PLAN, SPOKEN, offset=0)
    first = clock.place(0, 3000, 4000, False)
    assert [w.word for w in first] == ["Hello,"] and first[0].end <= 4000
    rest = clock.place(3000, 5000, 5000, True)           # the sentence ends early: the rest squeezed
    assert [w.word for w in rest] == ["big", "world."]
    assert first[0].end <= rest[0].start and rest[-1].end <= 5000


def test_the_front_end_maps_the_words_through_the_lexicon_and_the_normaliser(tmp_path):
    from velocity.tts.frontend import TextFrontend
    from velocity.tts.lexicon import Lexicon

    front = TextFrontend(tiny_checkpoint(tmp_path / "tiny", seed=0))
    sentences, _ = front.encode("We use SQL. It costs $5 at 10:30.", speaker=False,
                                lexicon=Lexicon({"SQL": "sequel"}))
    got = [w for s in sentences for w in s.words.words]
    assert [w for w, _ in got] == ["We", "use", "SQL.", "It", "costs", "$5", "at", "10:30."]
    assert dict(got)["SQL."] == "sequel." and dict(got)["$5"] == "five dollars"
    assert all(s.words.rate == speaking_rate("[speed_5]", "en") for s in sentences)


def test_sentence_words_travel_as_json():
    assert SentenceWords.from_json(PLAN.to_json()) == PLAN
    for bad in ("{}", '{"rate": 0, "words": []}', '{"rate": 4, "words": [1]}', "nope"):
        with pytest.raises(ValueError, match="SENTENCE_WORDS"):
            SentenceWords.from_json(bad)


def test_elevenlabs_alignment_spans_each_message_and_its_words():
    """Per message (Pipecat): the characters end where the message's audio does, so a reader
    that adds the spans keeps time; a message without words is one space; a word that runs past
    the message is cut at its end. From the context's start (LiveKit's sync_alignment): the same
    characters, shifted, and none for a message without words."""
    from velocity.gateway.word_times import MessageWords, alignment

    words = MessageWords()
    words.add([{"word": "Hi,", "start": 2400, "end": 9600, "spoken": "hi,"},
               {"word": "$5", "start": 12000, "end": 36000, "spoken": "five dollars"}], base=24000)
    got, t0, t1 = words.take(1.2)                    # [0, 1.2) s: "Hi," starts at 1.1 s
    a = alignment(got, t0, t1, absolute=False)
    assert "".join(a["chars"]) == "Hi, " and a["charStartTimesMs"][0] == 1100
    assert a["charStartTimesMs"][-1] + a["charDurationsMs"][-1] == 1200
    got, t0, t1 = words.take(1.0)                    # [1.2, 2.2) s: "$5" starts at 1.5 s, runs past
    a = alignment(got, t0, t1, absolute=False)
    n = alignment(got, t0, t1, absolute=False, key="spoken")
    assert "".join(a["chars"]) == "$5 " and "".join(n["chars"]) == "five dollars "
    assert a["charStartTimesMs"][0] == 300 and a["charStartTimesMs"][-1] + a["charDurationsMs"][-1] == 1000
    s = alignment(got, t0, t1, absolute=True)
    assert s["charStartTimesMs"][0] == 1500 and s["chars"] == a["chars"]
    got, t0, t1 = words.take(0.5)
    assert alignment(got, t0, t1, absolute=False) == {"chars": [" "], "charStartTimesMs": [0], "charDurationsMs": [500]}
    assert alignment(got, t0, t1, absolute=True)["chars"] == []
