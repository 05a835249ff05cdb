"""A pronunciation lexicon: whole-word, case-aware text replacements applied before normalisation.

ChatTTS reads text, not phonemes, so a name, a brand or an abbreviation is said another way by
writing it another way: {"SQL": "sequel", "GIF": "jif", "Nginx": "engine x", "重庆": "崇庆"}.
- Whole words: a key that starts (ends) with a letter or digit matches only where no letter or
  digit of a spaced script comes before (after) it, so "US" is not replaced inside "USB". Keys in
  scripts without spaces (Chinese, Japanese) match anywhere.
- Case-aware: a key in lower case matches any case ("sql" replaces "SQL" and "Sql"); a key with a
  capital matches only as written ("US" leaves "us" alone). Where both match, the exact one wins.
- The longest key wins where keys overlap; a replacement is not looked up again.

Files and requests give it as a JSON object of strings (`lexicon.json` beside the weights,
VELOCITY_LEXICON, the request's LEXICON input, merged over the server's). Numpy- and torch-free.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

FILE = "lexicon.json"
MAX_ENTRIES = 10_000
MAX_KEY_CHARS = 100
_NO_SPACES = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f"   # CJK, kana, hangul: no word boundaries
_WORD = rf"[^\W{_NO_SPACES}]"                                          # a letter or digit of a spaced script


class Lexicon:
    """Whole-word, case-aware replacements (see the module's docstring); empty: text unchanged."""

    def __init__(self, entries: dict[str, str] | None = None) -> None:
        self.entries = dict(entries or {})
        self.exact = {k: v for k, v in self.entries.items() if k != k.lower()}
        self.folded = {k: v for k, v in self.entries.items() if k == k.lower()}
        keys = sorted(self.entries, key=len, reverse=True)
        self._re = re.compile("|".join(map(_pattern, keys))) if keys else None

    def __len__(self) -> int:
        return len(self.entries)

    def apply(self, text: str) -> str:
        """text with every entry replaced."""
        if self._re is None:
            return text

        def one(m: re.Match) -> str:
            s = m.group(0)
            return self.exact.get(s, self.folded.get(s.lower(), s))

        return self._re.sub(one, text)

    def merged(self, over: "Lexicon | None") -> "Lexicon":
        """This lexicon with `over`'s entries added and replacing its own (a request's over the server's)."""
        return self if not over else Lexicon(self.entries | over.entries)

    @classmethod
    def from_json(cls, text: str | bytes, what: str = "LEXICON") -> "Lexicon":
        """A JSON object of strings -> Lexicon; ValueError naming `what` and what is wrong."""
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


def _pattern(key: str) -> str:
    body = re.escape(key)
    if key == key.lower():
        body = f"(?i:{body})"
    before = rf"(?<!{_WORD})" if re.match(_WORD, key[0]) else ""
    after = rf"(?!{_WORD})" if re.match(_WORD, key[-1]) else ""
    return before + body + after
