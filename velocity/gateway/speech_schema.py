"""The speech request's body as a Pydantic model (FastAPI's own way): OpenAI's fields, then one
field for each input of the request table (velocity.serving.wire.input_table.INPUTS) that has a body
field, with its type, range and help from the table. A new input of the table reaches the
API's validation and its OpenAPI page (/docs) with no line here.

`speech_model` builds the model; `read_body` validates a body against it and turns the first
error into the ApiError (400, OpenAI's shape) that names the field and what it allows."""
from __future__ import annotations

import math
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from velocity.gateway.encode import FORMATS
from velocity.gateway.upstream import ApiError
from velocity.serving.wire.input_table import INPUTS, INT_MAX, JSON, Input

MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "chattts")   # listed; any model name with "tts" is taken
MAX_TIMEOUT = 3600.0
SPEED = (0.25, 4.0)

# OpenAI's fields: (type, default (... : required), description, the error's words, Field's bounds)
OPENAI: dict[str, tuple] = {
    "model": (str, ..., f"the speech model: {', '.join(MODELS)}, or any name with \"tts\"",
              f"is required: one of {', '.join(MODELS)}", {}),
    "input": (str, ..., "the text to speak (VELOCITY_MAX_TEXT_CHARS at most; more with "
              "VELOCITY_GATEWAY_LONG_TEXT)", "is required: the text to speak", {}),
    "voice": (str, ..., "a voice (GET /v1/audio/voices), one of OpenAI's voice names, a blend of voices such as "
              "amber(2)+ash(1), or a speaker string",
              "is required: a voice or a speaker string", {}),
    "response_format": (Literal[tuple(FORMATS)], "mp3", "the audio's encoding",
                        f"must be one of {', '.join(FORMATS)}", {}),
    "stream_format": (Literal["audio", "sse"], "audio", "audio: the encoded audio as it comes; sse: server-sent "
                      "events (speech.audio.delta, speech.audio.done)", 'must be "audio" or "sse"', {}),
    "speed": (float, 1.0, "0.25 to 4.0, 1 normal: ChatTTS's [speed_N] (N = round(5 + 2 log2(speed)))",
              f"must be a number in [{SPEED[0]}, {SPEED[1]}]", {"ge": SPEED[0], "le": SPEED[1]}),
    "instructions": (Optional[str], None, "ChatTTS's control tokens only, such as [speed_3] or "
                     "[oral_2][laugh_0][break_6] (text refine's prompt); other text is ignored",
                     "must be a string", {}),
    "timeout": (Optional[float], None, "seconds the request may take (as the X-Request-Timeout header); past it, 504",
                f"must be seconds in (0, {MAX_TIMEOUT:.0f}]", {"gt": 0, "le": MAX_TIMEOUT}),
    "marks": (bool, False, 'with stream_format "sse": speech.sentence events, each sentence\'s text and its '
              "sample offsets", "must be true or false", {}),
    "words": (bool, False, 'with stream_format "sse": speech.words events, before each audio delta, the words '
              "estimated to start in it and their sample offsets (an estimate within each sentence)",
              "must be true or false", {}),
}


def table_field(i: Input, settings) -> tuple[Any, Any]:
    """An input of the table as a model field: its JSON type (a JSON input: an object or its
    text), its range (a bound the server sets: from settings, else the data type's) and its help."""
    kind = JSON[i.dtype]
    bounds: dict[str, float] = {}
    if kind in (int, float):
        hi = i.limit(i.hi, settings)
        hi = INT_MAX.get(i.dtype) if isinstance(hi, str) else hi
        if i.lo is not None:
            bounds["gt" if i.lo_open else "ge"] = i.lo
        if hi is not None:
            bounds["lt" if i.hi_open else "le"] = hi
        if kind is int and "lt" not in bounds:
            bounds["le"] = min(bounds.get("le", math.inf), INT_MAX[i.dtype])
        if kind is float:
            bounds["allow_inf_nan"] = False
    typ = Union[dict[str, Any], str] if i.json else kind
    return Optional[typ], Field(None, description=i.describe(), **bounds)


def speech_model(settings=None, inputs: tuple[Input, ...] = INPUTS) -> type[BaseModel]:
    """The body's model: OpenAI's fields, then the table's (strict: a number is no string, a bool
    no number; fields it does not know are ignored, as OpenAI's own)."""
    fields = {name: (typ, Field(default, description=help_, **bounds))
              for name, (typ, default, help_, _, bounds) in OPENAI.items()}
    fields |= {i.api_field: table_field(i, settings) for i in inputs if i.api_field}
    return create_model("SpeechRequest", __config__=ConfigDict(strict=True, extra="ignore"), **fields)


def read_body(model: type[BaseModel], body: dict, settings=None, inputs: tuple[Input, ...] = INPUTS) -> BaseModel:
    """The body, validated; ApiError 400 naming the first field in error and what it allows."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0])
        raise ApiError(400, message(name, body.get(name), err["type"], settings, inputs), name) from None


def message(name: str, v: object, kind: str, settings, inputs: tuple[Input, ...]) -> str:
    """The words for a field's error: its own (OpenAI's fields), or its input's range (the table's)."""
    if name in OPENAI:
        words = OPENAI[name][3]
        return f"{name} {words}" if words.startswith("is required") else f"{name} {words}, got {v!r}"
    i = next(i for i in inputs if i.api_field == name)
    if kind.endswith("_type") or kind.startswith(("union", "dict", "string", "model")):
        what = "a JSON object (or its text)" if i.json else JSON[i.dtype].__name__
        return f"{name} must be {what}, got {v!r}"
    try:
        i.check(v, settings, name)
    except ValueError as e:
        return str(e)
    return f"{name} must be {i.allowed(settings)}, got {v!r}"
