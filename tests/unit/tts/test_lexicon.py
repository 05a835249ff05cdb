"""The pronunciation lexicon (velocity/tts/lexicon.py) and the text front end that applies it:
whole words, case-aware, longest first, once; the server's file and a request's, merged; the
prompt ids are the replaced text's."""
from __future__ import annotations

import json

import pytest

from checkpoints import tiny_checkpoint
from velocity.tts.frontend import TextFrontend
from velocity.tts.lexicon import Lexicon

L = Lexicon({"NASA": "nasa", "sql": "sequel", "US": "U S", "us": "uss", "重庆": "崇庆", "C++": "C plus plus",
             "New York": "new york city", "York": "yorkie"})


@pytest.mark.parametrize("text,said", [
    ("NASA and nasa", "nasa and nasa"),                 # a key with a capital: only as written
    ("SQL, Sql and sql; mysql", "sequel, sequel and sequel; mysql"),   # lower case: any case, whole words
    ("US us USB", "U S uss USB"),                       # the exact key wins over the folded one
    ("我去重庆了", "我去崇庆了"),                         # no word boundaries in Chinese
    ("我爱NASA吗", "我爱nasa吗"),                         # a Latin word beside Chinese is a whole word
    ("use C++ now", "use C plus plus now"),             # keys are text, not patterns
    ("New York and York", "new york city and yorkie"),  # the longest key first, replacements not again
    ("NASA-led", "nasa-led"),
])
def test_whole_words_case_aware_longest_first_once(text, said):
    assert L.apply(text) == said


def test_a_request_lexicon_is_merged_over_the_servers():
    mine = L.merged(Lexicon({"NASA": "the agency", "GPU": "gee pee you"}))
    assert mine.apply("NASA GPU SQL") == "the agency gee pee you sequel"
    assert L.merged(None) is L and L.merged(Lexicon()) is L


@pytest.mark.parametrize("text,says", [
    ("{NASA: nasa}", "LEXICON is not valid JSON"),
    ('["NASA"]', "LEXICON must be a JSON object of word -> replacement, got list"),
    ('{"NASA": 7}', "LEXICON: the replacement of 'NASA' must be a string, got 7"),
    ('{" NASA": "x"}', "LEXICON: ' NASA' is not a word to replace"),
    ('{"": "x"}', "LEXICON: '' is not a word to replace"),
    (json.dumps({f"w{i}": "x" for i in range(10_001)}), "LEXICON has 10001 entries; the limit is 10000"),
])
def test_bad_lexicons_say_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace("[", r"\[")):
        Lexicon.from_json(text)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("lex") / "tiny", seed=0)


def test_the_prompt_ids_are_the_replaced_texts(folder, tmp_path):
    """lexicon.json beside the weights, VELOCITY_LEXICON's file instead, and a request's on top:
    each sentence's ids are those of the text as the lexicon says it."""
    plain = TextFrontend(folder)
    assert len(plain.lexicon) == 0
    (folder / "lexicon.json").write_text(json.dumps({"NASA": "the agency"}))   # (the tokenizer is uncased)
    try:
        served = TextFrontend(folder)
        ids = lambda fe, text, **kw: [s.token_ids for s in fe.encode(text, speaker=True, **kw)[0]]  # noqa: E731
        assert ids(served, "NASA flies.") == ids(plain, "the agency flies.") != ids(plain, "NASA flies.")
        request = Lexicon.from_json('{"flies": "soars"}')
        assert ids(served, "NASA flies.", lexicon=request) == ids(plain, "the agency soars.")
        other = tmp_path / "mine.json"
        other.write_text(json.dumps({"flies": "glides"}))
        assert ids(TextFrontend(folder, str(other)), "NASA flies.") == ids(plain, "NASA glides.")
        (folder / "lexicon.json").write_text("{broken")
        with pytest.raises(ValueError, match="lexicon.json is not valid JSON"):
            TextFrontend(folder)
    finally:
        (folder / "lexicon.json").unlink()


# The lexicon before the trie: one regex alternation of every key, longest first (compiling it
# took 2.4-3.1 ms a key). The trie must say exactly what it said.
def regex_apply(entries: dict[str, str], text: str) -> str:
    import re

    from velocity.tts.lexicon import _WORD

    def pattern(key: str) -> str:
        body = re.escape(key)
        if key == key.lower():
            body = f"(?i:{body})"
        before = rf"(?<!{_WORD})" if re.match(_WORD, key[0]) else ""
        after = rf"(?!{_WORD})" if re.match(_WORD, key[-1]) else ""
        return before + body + after

    if not entries:
        return text
    exact = {k: v for k, v in entries.items() if k != k.lower()}
    folded = {k: v for k, v in entries.items() if k == k.lower()}
    rx = re.compile("|".join(map(pattern, sorted(entries, key=len, reverse=True))))
    return rx.sub(lambda m: exact.get(m.group(0), folded.get(m.group(0).lower(), m.group(0))), text)


def test_the_trie_says_what_the_regex_said():
    from hypothesis import given, settings, strategies as st

    chars = st.sampled_from(list("abAB1 -+.重庆é"))
    keys = st.text(chars, min_size=1, max_size=4).map(str.strip).filter(bool)

    @settings(max_examples=400, deadline=None)
    @given(st.dictionaries(keys, st.text(st.sampled_from(list("xyZ ")), max_size=3), max_size=8),
           st.text(chars, max_size=30))
    def same(entries, text):
        assert Lexicon(entries).apply(text) == regex_apply(entries, text), (entries, text)

    same()


def test_the_replaced_text_keeps_the_text_limit():
    lex = Lexicon({"a": "x" * 200})
    assert lex.apply("a a", limit=500) == "x" * 200 + " " + "x" * 200
    with pytest.raises(ValueError, match="LEXICON makes the text longer than 300 characters, the limit of TEXT"):
        lex.apply("a " * 10_000, limit=300)            # stops as it passes the limit, not at the end
    with pytest.raises(ValueError, match="the replacement of 'a' has 201 characters; the limit is 200"):
        Lexicon.from_json(json.dumps({"a": "x" * 201}))


def test_a_request_lexicon_is_built_once_per_content():
    text = json.dumps({f"w{i}": "x" for i in range(50)})
    assert Lexicon.from_json(text) is Lexicon.from_json(text)
    server = Lexicon({"US": "U S"})
    assert server.merged(Lexicon.from_json(text)) is server.merged(Lexicon.from_json(text))


def test_a_large_lexicon_grows_only_the_part_a_text_reaches():
    """A request's fresh lexicon costs its front end in proportion to what its
    text walks, not to its size: the trie grows one first character at a time."""
    lex = Lexicon({f"w{k}x": "many" for k in range(3000)} | {"hello": "hi"})
    assert lex.apply("Hello there.") == "hi there."
    assert set(lex.trie) == {"h"}                 # no text reached a key that starts with "w"
    assert lex.apply("w7x and w2999x.") == "many and many."
    assert set(lex.trie) == {"h", "w"}
