"""The request inputs of the `tts` models: one table, and what is derived from it.

Each row names an input, its Triton type, what its absence means, its range or choices, its help
text, the models that take it and, where it has one, its field in the OpenAI API's body and its
`velocity-tts-client` option. From the table come: the parser (`read_inputs`, one pass, errors
naming the input and its range), the Triton configs' inputs (`triton_inputs`, written into the
config.pbtxt of `tts`, text_frontend and tts_offline by scripts/gen_inputs.py), the gateway's
body fields, the client's options and the inputs table of docs/api.md.

Numpy only (no torch): the gateway and the clients import it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from velocity.sampling_params import chattts_params, refine_params

MODELS = ("text_frontend", "tts", "tts_offline")
NUMPY = {"BYTES": object, "BOOL": np.bool_, "INT32": np.int32, "INT64": np.int64, "FP32": np.float32}
JSON = {"BYTES": str, "BOOL": bool, "INT32": int, "INT64": int, "FP32": float}
SEEDS = 2**63
INT_MAX = {"INT32": 2**31 - 1, "INT64": 2**63 - 1}


@dataclass(frozen=True, slots=True)
class Input:
    """One request input. `hi` and `max_chars` may name a Settings field (the server's limit);
    `field` and `flag` default to the name in lower case ("" derives them; None: not offered)."""
    name: str
    dtype: str                           # Triton's: BYTES, BOOL, INT32, INT64, FP32
    help: str
    default: object = None               # what absence means, for the docs (None: nothing)
    lo: float | None = None              # numbers: the allowed range
    hi: float | str | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple[str, ...] = ()        # text: the allowed values (absent or blank: `default`)
    max_chars: int | str | None = None   # text: the longest
    required: bool = False
    binary: bool = False                 # BYTES kept as bytes (a file), not decoded
    requires: tuple[str, str] | None = None   # (the input it needs, the error's words)
    json: bool = False                   # BYTES holding JSON: the API's field takes the object itself
    field: str | None = ""               # the OpenAI API body's field
    flag: str | None = ""                # velocity-tts-client's option
    models: tuple[str, ...] = MODELS

    @property
    def api_field(self) -> str | None:
        return self.name.lower() if self.field == "" else self.field

    @property
    def cli_flag(self) -> str | None:
        return "--" + self.name.lower().replace("_", "-") if self.flag == "" else self.flag

    def describe(self) -> str:
        """The help text with the range or choices and the default, as the docs and --help give it."""
        parts = [self.help]
        if self.required:
            parts.append("required")
        if self.lo is not None:
            parts.append(self.allowed())
        if self.choices:
            parts.append(" or ".join(self.choices))
        if self.max_chars is not None:
            parts.append(f"up to {self.limit(self.max_chars)} characters")
        if self.default not in (None, False):
            parts.append(f"default {fmt(self.default)}")
        if self.requires:
            parts.append(f"only with {self.requires[0]}")
        return "; ".join(parts)

    @staticmethod
    def limit(value: float | str | None, settings=None) -> float | str | None:
        """A bound: a number, or the Settings field it names (without settings: its variable)."""
        if not isinstance(value, str):
            return value
        return getattr(settings, value) if settings is not None else f"VELOCITY_{value.upper()}"

    def allowed(self, settings=None) -> str:
        """The range in words: "in (0, 1]", ">= 0", "in [1, 2048]" (without settings: "in [1,
        VELOCITY_MAX_NEW_TOKENS]")."""
        lo, hi = self.lo, self.limit(self.hi, settings)
        if hi is None:
            return f"{'>' if self.lo_open else '>='} {fmt(lo)}"
        return f"in {'(' if self.lo_open else '['}{fmt(lo)}, {fmt(hi)}{')' if self.hi_open else ']'}"

    def read(self, value: np.ndarray | None, settings) -> object:
        """The input's value from its tensor (None: absent), checked; ValueError naming it and its range."""
        if value is None or value.size == 0:
            if self.required:
                raise ValueError(f"{self.name} is required: {self.help.split(';')[0]}")
            return None
        if value.size != 1:
            raise ValueError(f"{self.name} must hold one value, got {value.size}")
        if self.dtype == "BYTES":
            return self._text(value, settings)
        if self.dtype == "BOOL":
            if value.dtype.kind not in "biu":
                raise ValueError(f"{self.name} must be one BOOL, got {value.dtype}")
            return bool(value.reshape(-1)[0])
        integer = self.dtype.startswith("INT")
        if value.dtype.kind not in ("iu" if integer else "iuf"):
            raise ValueError(f"{self.name} must be {'an integer' if integer else 'a number'}, got data type {value.dtype}")
        return self.check(value.reshape(-1)[0].item(), settings)

    def check(self, v: float, settings=None, name: str | None = None) -> float:
        """A number in range (ValueError naming `name`, default the input's, and the range). Without
        settings a bound that names one is the data type's: a value is checked before any cast, and
        the server checks it against its own limit."""
        name = name or self.name
        hi = self.limit(self.hi, settings)
        hi = None if isinstance(hi, str) else hi                # a setting's limit, unknown here
        ok = (math.isfinite(v) and (self.lo is None or (v > self.lo if self.lo_open else v >= self.lo))
              and (hi is None or (v < hi if self.hi_open else v <= hi)))
        if not ok:
            raise ValueError(f"{name} must be {self.allowed(settings)}, got {v}")
        top = INT_MAX.get(self.dtype)
        if top is not None and v > top:                         # what the input's type holds
            raise ValueError(f"{name} must be {self.allowed(settings)} and at most {top}, got {v}")
        return v

    def _text(self, value: np.ndarray, settings) -> object:
        raw = value.reshape(-1)[0]
        if self.binary:
            if value.dtype != object:
                raise ValueError(f"{self.name} must be one BYTES value, got {value.dtype}")
            return raw if raw else None
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError as e:
            raise ValueError(f"{self.name} must be UTF-8 text ({e})") from e
        if self.required and not text.strip():
            raise ValueError(f"{self.name} must not be empty or only whitespace")
        limit = self.limit(self.max_chars, settings)
        if limit is not None and len(text) > limit:
            raise ValueError(f"{self.name} has {len(text)} characters; the limit is {limit}")
        if self.choices:
            text = text.strip() or self.default
            if text not in self.choices:
                raise ValueError(f"{self.name} must be one of {', '.join(map(repr, self.choices))} "
                                 f"(default {self.default!r}), got {text!r}")
        return text


def fmt(x: object) -> str:
    return "2^63" if x == SEEDS else f"{x:g}" if isinstance(x, float) else str(x)


def sampling_rows(prefix: str, defaults, what: str, max_new: dict, requires=None) -> list[Input]:
    """The five sampling inputs of a head (prefix "" for the audio's, "REFINE_" for text refine's)."""
    d = defaults()
    return [Input(prefix + "TEMPERATURE", "FP32", f"{what}: sampling temperature (0: greedy)", d.temperature,
                  lo=0, requires=requires),
            Input(prefix + "TOP_P", "FP32", f"{what}: nucleus sampling's probability mass", d.top_p,
                  lo=0, lo_open=True, hi=1, requires=requires),
            Input(prefix + "TOP_K", "INT32", f"{what}: the k most likely tokens (0: off)", d.top_k,
                  lo=0, requires=requires),
            Input(prefix + "REPETITION_PENALTY", "FP32", f"{what}: the reference's repetition penalty",
                  d.repetition_penalty, lo=0, lo_open=True, requires=requires),
            Input(prefix + "MAX_NEW_TOKENS", "INT32", **max_new, lo=1, requires=requires)]


REFINE = ("REFINE_TEXT", "is for text refine: send REFINE_TEXT true with it")
REFINE_MAX_NEW_TOKENS = 1024           # the text head's tokens per sentence (the reference's default: 384)

INPUTS: tuple[Input, ...] = (
    Input("TEXT", "BYTES", "the text to speak, UTF-8", max_chars="max_text_chars", required=True,
          field=None, flag=None),
    Input("PROMPT", "BYTES", "control tokens only, such as [speed_5]", "[speed_5]", field=None),
    Input("SPEAKER", "BYTES", "a speaker string of the ChatTTS release", field=None),
    Input("SPEAKER_SEED", "INT64", "instead of SPEAKER: a random speaker from this seed, drawn as the reference "
          "does from the release's speaker statistics (asset/spk_stat.pt)", lo=0, hi=SEEDS, hi_open=True,
          field=None),
    Input("VOICE", "BYTES", "a named voice (velocity-tts-client --list-voices), or a blend of them such as "
          "amber(2)+ash(1) (docs/voices.md); without VOICE, SPEAKER, "
          "SPEAKER_SEED or SPEAKER_SAMPLE: the default voice (VELOCITY_DEFAULT_VOICE)", field=None),
    *sampling_rows("", chattts_params, "audio", {
        "help": "audio frames per sentence",
        "default": "VELOCITY_MAX_NEW_TOKENS", "hi": "max_new_tokens"}),
    Input("SEED", "INT64", "sampling seed: the same seed gives the same frames (and audio, up to float rounding)",
          lo=0, hi=SEEDS, hi_open=True),
    Input("DECODER", "BYTES", "hidden (as ChatTTS): mel from the GPT's hidden states with asset/Decoder.safetensors; "
          "codes: from the audio codes with the DVAE", "hidden", choices=("hidden", "codes")),
    Input("SPEAKER_SAMPLE", "BYTES", "a voice to clone: a recording's file bytes (WAV, FLAC, Ogg, AIFF; "
          "0.2 s to VELOCITY_MAX_SAMPLE_SECONDS) or its sample string (velocity-tts-voice, the reference's spk_smp)",
          binary=True, flag="--sample"),
    Input("SAMPLE_TEXT", "BYTES", "the transcript of SPEAKER_SAMPLE (the reference's txt_smp)", max_chars=500,
          requires=("SPEAKER_SAMPLE", "is the transcript of SPEAKER_SAMPLE: send it with one")),
    Input("SSML", "BOOL", "true: TEXT is SSML, <speak>...</speak> (breaks, prosody rate, sub, say-as, voice, p and "
          "s: docs/voices.md); the gateway sets it for an input that starts with <speak>", False, field=None),
    Input("LEXICON", "BYTES", "pronunciations for this request: a JSON object of word -> replacement (whole "
          "words, case-aware), merged over the server's lexicon (VELOCITY_LEXICON)", max_chars=100_000, json=True),
    Input("VOICE_CARRY_OVER", "BOOL", "true: a text of several sentences without a voice sample keeps its "
          "first sentence's voice, as the reference speaks it (the first sentence is generated twice: later "
          "first audio); not with REFINE_TEXT", "VELOCITY_VOICE_CARRY_OVER"),
    Input("REFINE_TEXT", "BOOL", "true: text refine first (the reference's default first pass; off here, for "
          "latency)", False, field="refine", flag="--refine"),
    Input("REFINE_PROMPT", "BYTES", "control tokens that end the refine prompt, such as [oral_2][laugh_0][break_6]",
          requires=REFINE, field=None),
    *sampling_rows("REFINE_", refine_params, "text refine", {
        "help": "text refine: text tokens per sentence", "default": refine_params().max_new_tokens,
        "hi": REFINE_MAX_NEW_TOKENS}, requires=REFINE),
    Input("CLIENT", "BYTES", "who asks, for the engine's fair share of its batch between clients: the gateway "
          "and Wyoming send a digest of the caller's API key or address, signed with the run's key; every request "
          "without a valid one is one client",
          max_chars=128, field=None, flag=None),
)
BY_NAME = {i.name: i for i in INPUTS}
PARAM_INPUTS = ("TEMPERATURE", "TOP_P", "TOP_K", "REPETITION_PENALTY", "MAX_NEW_TOKENS", "SEED")


def read_inputs(get, settings) -> dict[str, object]:
    """get(name) -> np.ndarray | None. Every input read and checked in one pass (absent: None),
    then each input that needs another checked for it; ValueError naming the input."""
    values = {i.name: i.read(get(i.name), settings) for i in INPUTS}
    for i in INPUTS:
        if i.requires and values[i.name] not in (None, "") and not values[i.requires[0]]:
            raise ValueError(f"{i.name} {i.requires[1]}")
    return values


def triton_inputs(model: str) -> list[dict]:
    """The model's inputs as its config declares them (name, data_type, dims, optional): [1] for
    text_frontend (batched by Triton), [1, 1] for the others. TEXT is optional only in the `tts`
    ensemble, so that text_frontend always runs and says it is missing."""
    dims = [1] if model == "text_frontend" else [1, 1]
    return [{"name": i.name, "data_type": "TYPE_" + ("STRING" if i.dtype == "BYTES" else i.dtype), "dims": dims,
             "optional": not i.required or model == "tts"} for i in INPUTS if model in i.models]


def make_inputs(module, values: dict) -> list:
    """tritonclient InferInputs, each [1, 1], for the given inputs (None values left out); an integer
    its input's type cannot hold is a ValueError naming it (numpy would wrap or overflow it); the
    server checks the ranges."""
    for name, v in values.items():
        top = INT_MAX.get(BY_NAME[name].dtype)
        if top is not None and isinstance(v, int) and not -top - 1 <= v <= top:
            raise ValueError(f"{name} must be {BY_NAME[name].allowed()} and at most {top}, got {v}")
    return array_inputs(module, {name: np.array([[v.encode() if isinstance(v, str) else v]], dtype=NUMPY[BY_NAME[name].dtype])
                                 for name, v in values.items() if v is not None})


def array_inputs(module, arrays: dict[str, np.ndarray]) -> list:
    """tritonclient InferInputs (module: tritonclient.grpc or .http) holding these arrays, their
    Triton datatype from the numpy one."""
    from tritonclient.utils import np_to_triton_dtype

    out = []
    for name, arr in arrays.items():
        t = module.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        t.set_data_from_numpy(arr)
        out.append(t)
    return out
