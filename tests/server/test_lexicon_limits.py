"""Lexicons cannot hold the text front end up nor blow the text up. A request's
lexicon of 8,000 keys (what LEXICON's 100,000 characters hold with 3-letter keys) is built in a
step per key character (a trie; the regex before took 2.4-3.1 ms a key to compile: 19-25 s for
each request, and the front end served no one else meanwhile): the client waits at most 10 s
for it, far above what the build takes now, which the code before missed by minutes; a lexicon
that makes the text longer than the text limit is a 400 naming it. Through the gateway of the
shared server."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.server
BODY = {"model": "tts-1", "voice": "amber", "response_format": "pcm", "max_new_tokens": 4}


def post(gateway: str, body: dict, timeout: float = 120) -> tuple[int, object]:
    req = urllib.request.Request(gateway + "/v1/audio/speech", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())["error"]


def test_a_large_lexicon_is_answered_within_its_deadline(gateway):
    import itertools
    import string

    keys = ("".join(k) for k in itertools.product(string.ascii_lowercase + string.digits, repeat=3))
    lexicon = {k: "x" for k in itertools.islice(keys, 8_000)} | {"Hi": "hello"}
    assert len(json.dumps(lexicon, ensure_ascii=False)) < 100_000
    status, got = post(gateway, BODY | {"input": "Hi aab.", "lexicon": lexicon}, timeout=10)
    assert status == 200 and len(got) > 0, got


def test_a_lexicon_that_blows_the_text_up_is_refused(gateway):
    """A 19 KB request that became 2 MB of text before: now a 400 naming the lexicon."""
    lexicon = {"a": "x" * 200}
    status, err = post(gateway, BODY | {"input": "a " * 900, "lexicon": lexicon})
    assert status == 400 and err["param"] == "lexicon", err
    assert "LEXICON makes the text longer than 2000 characters, the limit of TEXT" in err["message"], err
    status, err = post(gateway, BODY | {"input": "a", "lexicon": {"a": "x" * 201}})
    assert status == 400 and "the replacement of 'a' has 201 characters; the limit is 200" in err["message"], err
