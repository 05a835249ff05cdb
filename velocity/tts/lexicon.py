"""A pronunciation lexicon: whole-word, case-aware text replacements applied before normalisation.

ChatTTS reads text, not phonemes, so a name, a brand or an abbreviation is said another way by
writing it another way: {"SQL": "sequel", "GIF": "jif", "Nginx": "engine x", "重庆": "崇庆"}.
- Whole words: a key that starts (ends) with a letter or digit matches only where no letter or
  digit of a spaced script comes before (after) it, so "US" is not replaced inside "USB". Keys in
  scripts without spaces (Chinese, Japanese) match anywhere.
- Case-aware: a key in lower case matches any case ("sql" replaces "SQL" and "Sql"); a key with a
  capital matches only as written ("US" leaves "us" alone). Where both match, the exact one wins.
- The longest key wins where keys overlap; a replacement is not looked up again.

Matching walks a trie of the keys in lower case from each position of the text, so its cost grows
with the text and the longest key, not with the number of keys, and building one costs a step per
key character (a regex alternation of 10,000 keys took about 30 s to compile). A request's
lexicon is built once per content (`from_json` keeps the last few).

Files and requests give it as a JSON object of strings (`lexicon.json` beside the weights,
VELOCITY_LEXICON, the request's LEXICON input, merged over the server's). Numpy- and torch-free.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

FILE = "lexicon.json"
MAX_ENTRIES = 10_000
MAX_KEY_CHARS = 100
MAX_REPLACEMENT_CHARS = 200
_NO_SPACES = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f"   # CJK, kana, hangul: no word boundaries
_WORD = rf"[^\W{_NO_SPACES}]"                                          # a letter or digit of a spaced script


class Lexicon:
    """Whole-word, case-aware replacements (see the module's docstring); empty: text unchanged."""

    def __init__(self, entries: dict[str, str] | None = None) -> None:
        self.entries = dict(entries or {})
        self.exact = {k: v for k, v in self.entries.items() if k != k.lower()}
        self.folded = {k: v for k, v in self.entries.items() if k == k.lower()}
        self.first: dict[str, list[str]] = {}    # a first character -> the keys that start with it (lower case)
        for k in self.entries:
            low = _lower(k)
            self.first.setdefault(low[0], []).append(low)
        # lower-case key characters -> child; END: the key's length. Grown one first character at a
        # time, as a text first reaches it: a request's text is short and its lexicon may be large,
        # so most of a fresh lexicon is never walked (and never costs its building)
        self.trie: dict = {}

    def __len__(self) -> int:
        return len(self.entries)

    def apply(self, text: str, limit: int | None = None, what: str = "LEXICON") -> str:
        """text with every entry replaced; ValueError naming `what` once the result passes `limit`
        characters (checked as it grows: a lexicon may lengthen a text many times)."""
        if not self.entries:
            return text
        low = _lower(text)
        out, n, i, start = [], 0, 0, 0          # out holds text[..start) replaced
        while i < len(text):
            got = self._match(text, low, i)
            if got is None:
                i += 1
                continue
            end, said = got
            out += (text[start:i], said)
            n += i - start + len(said)
            if limit is not None and n > limit:
                raise ValueError(f"{what} makes the text longer than {limit} characters, the limit of TEXT")
            i = start = end
        out.append(text[start:])
        result = "".join(out)
        if limit is not None and len(result) > limit:
            raise ValueError(f"{what} makes the text {len(result)} characters long; the limit of TEXT is {limit}")
        return result

    def _match(self, text: str, low: str, i: int) -> tuple[int, str] | None:
        """The longest entry that matches at i as a whole word: (its end, its replacement), or None."""
        if i and _is_word(text[i - 1]) and _is_word(text[i]):
            return None                         # inside a word: only a key that does not start with one
        node, best, j = self._root(low[i]), None, i + 1       # node: the trie of text[i:j]
        while node is not None:
            if END in node and not (j < len(text) and _is_word(text[j - 1]) and _is_word(text[j])):
                s = text[i:j]
                said = self.exact.get(s, self.folded.get(s.lower()))
                if said is not None:
                    best = (j, said)
            if j == len(text):
                break
            node, j = node.get(low[j]), j + 1
        return best

    def _root(self, c: str) -> dict | None:
        """The trie below first character c (grown at its first use), or None: no key starts with c."""
        node = self.trie.get(c)
        if node is None and c in self.first:
            node = {}
            for low in self.first[c]:
                n = node
                for ch in low[1:]:
                    n = n.setdefault(ch, {})
                n[END] = len(low)
            self.trie[c] = node               # whole before it is seen (a lexicon may serve threads)
        return node

    def merged(self, over: "Lexicon | None") -> "Lexicon":
        """This lexicon with `over`'s entries added and replacing its own (a request's over the server's);
        the last few pairs are kept, as `from_json` keeps the request's."""
        return self if not over else over if not self else _merged(self, over)

    @classmethod
    def from_json(cls, text: str | bytes, what: str = "LEXICON") -> "Lexicon":
        """A JSON object of strings -> Lexicon; ValueError naming `what` and what is wrong. The last
        few are kept by content: a client that sends its lexicon with every request builds it once."""
        return _from_json(cls, text, what)

    @classmethod
    def _parse(cls, text: str | bytes, what: str) -> "Lexicon":
        try:
            entries = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{what} is not valid JSON ({e}): give an object such as "
                             '{"SQL": "sequel", "GIF": "jif"}') from e
        if not isinstance(entries, dict):
            raise ValueError(f"{what} must be a JSON object of word -> replacement, got {type(entries).__name__}")
        if len(entries) > MAX_ENTRIES:
            raise ValueError(f"{what} has {len(entries)} entries; the limit is {MAX_ENTRIES}")
        for k, v in entries.items():
            if not isinstance(v, str):
                raise ValueError(f"{what}: the replacement of {k!r} must be a string, got {v!r}")
            if not k.strip() or k != k.strip() or len(k) > MAX_KEY_CHARS:
                raise ValueError(f"{what}: {k!r} is not a word to replace (1 to {MAX_KEY_CHARS} characters, "
                                 "no space at either end)")
            if len(v) > MAX_REPLACEMENT_CHARS:
                raise ValueError(f"{what}: the replacement of {k!r} has {len(v)} characters; the limit is "
                                 f"{MAX_REPLACEMENT_CHARS}")
        return cls(entries)

    @classmethod
    def load(cls, path: str | Path) -> "Lexicon":
        """The lexicon in a JSON file; ValueError naming the file."""
        return cls.from_json(Path(path).read_bytes(), str(path))

    @classmethod
    def for_weights(cls, folder: str | Path, path: str = "") -> "Lexicon":
        """The server's lexicon: `path` (VELOCITY_LEXICON), else <weights>/lexicon.json if there, else empty."""
        if path:
            return cls.load(path)
        found = Path(folder) / FILE
        return cls.load(found) if found.is_file() else cls()


END = ""                                    # a trie node's key: a key ends here (no character is "")
_WORD_RE = re.compile(_WORD)


def _is_word(c: str) -> bool:
    """A letter or digit of a spaced script: where a whole word may not begin or end beside it."""
    return _WORD_RE.match(c) is not None


def _lower(text: str) -> str:
    """text in lower case, character by character (a character whose lower case is longer, such as
    'İ', is kept): positions stay those of the text."""
    low = text.lower()
    return low if len(low) == len(text) else "".join(c if len(c.lower()) != 1 else c.lower() for c in text)


@functools.lru_cache(maxsize=8)
def _merged(base: Lexicon, over: Lexicon) -> Lexicon:
    return Lexicon(base.entries | over.entries)


@functools.lru_cache(maxsize=8)
def _from_json(cls: type, text: str | bytes, what: str) -> Lexicon:
    return cls._parse(text, what)
