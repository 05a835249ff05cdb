"""Named voices: a small built-in set drawn from the release's speaker statistics with fixed seeds,
plus the operator's own from a voices file (`voices.json` beside the weights, or VELOCITY_VOICES: a
file or a folder of them). An entry is a speaker string, or a voice sample with its transcript:

    {"narrator": "<speaker string>",
     "me": {"sample": "<velocity-tts-voice string>", "sample_text": "what the recording says"},
     "alloy": {"alias": "narrator"}}

A request picks one with VOICE; one that names no voice at all gets the default voice, so every
sentence of it speaks in one voice (with [empty_spk] the GPT picks a voice per sentence).

OpenAI's voice names (alloy, ash, ...) are aliases of the built-in voices by default, so that
programs written for OpenAI's speech API work unchanged; a voices file may point any of them
(or any other name) at another voice with {"alias": "<voice>"}.

A VOICE of the form `amber(2)+ash(1)` is a blend of those voices (velocity.tts.voice_blend).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from velocity.tts import voice_blend
from velocity.tts.speaker import SpeakerError, decode_speaker, encode_speaker, random_speaker

log = logging.getLogger(__name__)

# name -> the seed of its draw from the release's speaker statistics (torch.manual_seed(seed), as
# the reference's sample_random_speaker); what they sound like depends on the weights
BUILTIN = {"amber": 1001, "basil": 1002, "cedar": 1003, "dune": 1004, "ember": 1005, "fern": 1006}
# OpenAI's speech voices -> built-in voices, spread over all six (operators re-point them in voices.json)
OPENAI_ALIASES = {"alloy": "amber", "ash": "basil", "ballad": "cedar", "coral": "dune", "echo": "ember",
                  "fable": "fern", "nova": "amber", "onyx": "basil", "sage": "cedar", "shimmer": "dune",
                  "verse": "ember"}
DEFAULT_VOICE = "amber"
VOICES_FILE = "voices.json"


@dataclass(frozen=True)
class Voice:
    """A named voice: a speaker vector, or a sample (string) with its transcript, or both."""
    name: str
    speaker: np.ndarray | None = None
    sample: str | None = None
    sample_text: str = ""
    source: str = "built-in"

    @property
    def kind(self) -> str:
        return "sample" if self.sample else "speaker"

    @property
    def cloned(self) -> bool:
        """Made from a recording: no speaker vector alone to blend or to switch to within a request."""
        return bool(self.sample) or self.speaker is None


def builtin_voices(dim: int, stats: np.ndarray | None, draw: bool = True) -> dict[str, Voice]:
    """The built-in set: each a seeded draw from the speaker statistics (a plain normal without
    them); draw=False: their names alone, no vector (a listing, without torch's generator)."""
    return {name: Voice(name, random_speaker(seed, dim, stats) if draw else None) for name, seed in BUILTIN.items()}


def voice_files(path: Path) -> list[Path]:
    """A voices file, or the *.json files of a folder, in name order."""
    if path.is_dir():
        return sorted(path.glob("*.json"))
    return [path] if path.is_file() else []


def read_voices(path: Path, dim: int) -> tuple[dict[str, Voice], dict[str, str]]:
    """One voices file -> (its voices, its aliases: name -> voice); ValueError naming the file and
    the entry that is wrong."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON voices file ({e})") from e
    if not isinstance(entries, dict):
        raise ValueError(f"{path}: must hold a JSON object of name -> voice")
    out, aliases = {}, {}
    for name, entry in entries.items():
        where = f"{path}: voice {name!r}"
        if isinstance(entry, str):
            entry = {"speaker": entry}
        if isinstance(entry, dict) and set(entry) == {"alias"} and isinstance(entry["alias"], str):
            aliases[name] = entry["alias"]
            continue
        if not isinstance(entry, dict) or not ({"speaker", "sample"} & set(entry)):
            raise ValueError(f"{where}: give a speaker string, an object with \"speaker\" and/or \"sample\", "
                             "or {\"alias\": \"<another voice>\"}")
        try:
            spk = decode_speaker(entry["speaker"], dim) if entry.get("speaker") else None
        except SpeakerError as e:
            raise ValueError(f"{where}: {e}") from e
        out[name] = Voice(name, spk, entry.get("sample") or None, str(entry.get("sample_text", "")), str(path))
    return out, aliases


def add_voice(path: Path, name: str, sample: str | None = None, sample_text: str = "",
              speaker: np.ndarray | None = None) -> None:
    """Add (or replace) a voice in a voices file, creating it if need be."""
    entries = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    entry: dict = {}
    if speaker is not None:
        entry["speaker"] = encode_speaker(speaker)
    if sample:
        entry |= {"sample": sample, "sample_text": sample_text}
    entries[name] = entry
    path.write_text(json.dumps(entries, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


class Voices:
    """The voices a server offers, by name, and the default for requests that name none.
    draw=False leaves the built-in voices' vectors out: for a listing (the `voices` model)."""

    def __init__(self, folder: str | Path, dim: int, stats: np.ndarray | None, path: str = "",
                 default: str = DEFAULT_VOICE, draw: bool = True) -> None:
        self.voices = builtin_voices(dim, stats, draw)
        self.stats = stats                                     # for blends
        self.aliases: dict[str, str] = dict(OPENAI_ALIASES)    # name -> the voice it stands for
        source = Path(path) if path else Path(folder) / VOICES_FILE
        if path and not source.exists():
            raise ValueError(f"VELOCITY_VOICES={path}: no such file or folder")
        for f in voice_files(source):
            voices, aliases = read_voices(f, dim)
            for name in voices:                        # a voice of the file wins over a default alias
                self.aliases.pop(name, None)
            self.voices |= voices
            for name in aliases:
                self.voices.pop(name, None)
            self.aliases |= aliases
            for name, target in aliases.items():
                if target not in self.voices and target not in self.aliases:
                    raise ValueError(f"{f}: voice {name!r} is an alias of {target!r}, which is not a voice here")
        for name in self.aliases:
            self.resolve(name)                         # no alias that leads nowhere or in a circle
        if default and default not in self.voices and default not in self.aliases:
            raise ValueError(f"the default voice {default!r} is not one of {sorted(self.voices)}")
        self.default = default
        log.info("%d voices (%s) and %d aliases, default %s", len(self.voices), ", ".join(sorted(self.voices)),
                 len(self.aliases), default or "none")

    def resolve(self, name: str) -> str:
        """The voice a name stands for: itself, or where its aliases lead."""
        seen = [name]
        while name in self.aliases:
            name = self.aliases[name]
            if name in seen:
                raise ValueError(f"voice aliases go in a circle: {' -> '.join(seen + [name])}")
            seen.append(name)
        return name

    def get(self, name: str) -> Voice:
        """ValueError naming the voices there are, for a name that is not one (nor an alias nor a blend)."""
        if voice_blend.is_blend(name):
            return self.blend(name)
        voice = self.voices.get(self.resolve(name))
        if voice is None:
            raise ValueError(f"VOICE {name!r} is not a voice here; voices: {', '.join(sorted(self.voices))} "
                             f"(and OpenAI's names: {', '.join(sorted(self.aliases))})")
        return voice

    def blend(self, spec: str) -> Voice:
        """A blend such as `amber(2)+ash(1)` (velocity.tts.voice_blend); ValueError naming VOICE and
        the part that cannot be blended."""
        parts = voice_blend.parse(spec)
        voices = [self.get(name) for name, _ in parts]
        for (name, _), v in zip(parts, voices):
            if v.cloned:
                raise ValueError(f"VOICE {spec!r}: {name!r} is a voice cloned from a recording, which has no speaker "
                                 "vector to blend: blend voices that are speakers")
        return Voice(spec, voice_blend.mix([v.speaker for v in voices], [w for _, w in parts], self.stats),
                     source="blend")

    def listing(self) -> dict:
        """What the `voices` model answers: the default and each voice's name, kind and source; an
        alias as kind "alias" with the voice it stands for."""
        voices = [{"name": v.name, "kind": v.kind, "source": v.source, "sample_text": v.sample_text}
                  for v in self.voices.values()]
        voices += [{"name": a, "kind": "alias", "source": self.resolve(a), "sample_text": ""} for a in self.aliases]
        return {"default": self.default, "voices": sorted(voices, key=lambda v: v["name"])}
