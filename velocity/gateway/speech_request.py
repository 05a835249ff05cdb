"""A speech request's body, read as the OpenAI API and our extensions have it: the `tts` inputs it
makes (triton_values, through the body's model: speech_schema, from the request table
velocity.serving.wire.input_table.INPUTS), its timeout, and its sentence marks (Marks)."""
import json
import math

from pydantic import BaseModel

from velocity.gateway.speech_schema import MAX_TIMEOUT, MODELS, read_body
from velocity.gateway.upstream import ApiError
from velocity.serving.wire.input_table import INPUTS
from velocity.tts import voice_blend
from velocity.tts.control import CONTROL
from velocity.tts.ssml import is_ssml

SAMPLE_RATE = 24000                  # the release's, what `tts` streams
TIMEOUT_HEADER = "x-request-timeout"  # seconds, as the body's "timeout"


def speed_prompt(speed: float) -> str:
    """OpenAI's speed (0.25-4.0, 1 = normal) -> ChatTTS's [speed_N] (0-9, 5 = normal):
    N = round(5 + 2 log2(speed)), so 0.25 -> 1, 0.5 -> 3, 1 -> 5, 2 -> 7, 4 -> 9."""
    return f"[speed_{min(9, max(0, round(5 + 2 * math.log2(speed))))}]"


def instruction_inputs(instructions: str) -> dict:
    """OpenAI's `instructions` -> `tts` inputs. ChatTTS follows no free-form instructions: text
    that holds only its control tokens is used ([speed_N] in the prompt, the others such as
    [oral_2][laugh_0][break_6] as text refine's prompt, which turns text refine on); any other
    text is ignored, as documented."""
    if not instructions.strip() or CONTROL.sub("", instructions).strip():
        return {}
    tokens = CONTROL.findall(instructions)
    speed = [t for t in tokens if t.startswith("[speed_")]
    refine = "".join(t for t in tokens if not t.startswith("[speed_"))
    out = {"PROMPT": speed[-1]} if speed else {}
    return out | ({"REFINE_TEXT": True, "REFINE_PROMPT": refine} if refine else {})


def request_timeout(req: BaseModel, header: str | None) -> float | None:
    """The request's deadline in seconds (the body's `timeout`, checked by its model, else the
    X-Request-Timeout header)."""
    if req.timeout is not None or header is None:
        return req.timeout
    try:
        t = float(header)
    except ValueError:
        t = math.nan
    if not 0 < t <= MAX_TIMEOUT:
        raise ApiError(400, f"timeout must be seconds in (0, {MAX_TIMEOUT:.0f}], got {header!r}", "timeout")
    return t


def blend_of(voice: str, voices: dict[str, str]) -> str:
    """A blend's voice field, its names checked against the server's voices (ApiError 400)."""
    try:
        parts = voice_blend.parse(voice, "voice")
    except ValueError as e:
        raise ApiError(400, str(e), "voice") from None
    for name, _ in parts:
        if name not in voices:
            raise ApiError(400, f"voice {voice!r}: {name!r} is not a voice here; voices: "
                                f"{', '.join(n for n, k in voices.items() if k != 'alias')}", "voice")
        if voices[name] == "sample":
            raise ApiError(400, f"voice {voice!r}: {name!r} is a voice cloned from a recording, which has no "
                                "speaker vector to blend: blend voices that are speakers", "voice")
    return voice


def triton_values(model: type[BaseModel], body: dict, voices: dict[str, str], settings=None
                  ) -> tuple[dict, BaseModel]:
    """The request body -> (the `tts` inputs, the body as its model: speech_schema.speech_model);
    ApiError 400 naming the field and its allowed values. voices: the server's voice names -> their
    kind. Numbers are checked against their input's range (settings: the limits it names) by the
    model, before anything is cast."""
    req = read_body(model, body, settings)
    if req.model not in MODELS and "tts" not in req.model.lower():
        raise ApiError(400, f"model must be a speech model ({', '.join(MODELS)}, or any name with \"tts\"), "
                            f"got {req.model!r}", "model")
    values: dict = {"TEXT": req.input, "PROMPT": speed_prompt(req.speed)}
    if is_ssml(req.input):                    # <speak>...</speak>: the server reads it as SSML
        values["SSML"] = True
    if req.instructions is not None:
        values |= instruction_inputs(req.instructions)
    if req.voice in voices:
        values["VOICE"] = req.voice
    elif voice_blend.is_blend(req.voice):     # amber(2)+ash(1): the server mixes them
        values["VOICE"] = blend_of(req.voice, voices)
    elif len(req.voice) > 32:                 # a speaker string (the release's are ~300 characters)
        values["SPEAKER"] = req.voice
    else:
        own = ", ".join(n for n, kind in voices.items() if kind != "alias")
        raise ApiError(400, f"voice {req.voice!r} is not a voice here; voices: {own}, OpenAI's names "
                            f"({', '.join(n for n, kind in voices.items() if kind == 'alias')}) or a speaker string",
                       "voice")
    for i in INPUTS:                          # our extras: the inputs with a body field
        v = getattr(req, i.api_field) if i.api_field else None
        if v is not None:
            values[i.name] = json.dumps(v, ensure_ascii=False) if i.json and isinstance(v, dict) else v
    return values, req


def events_asked(req: BaseModel) -> tuple[bool, bool]:
    """The body's `marks` and `words` (our extensions: speech.sentence and speech.words events in
    the SSE stream)."""
    for name, event in (("marks", "speech.sentence"), ("words", "speech.words")):
        if getattr(req, name) and req.stream_format != "sse":
            raise ApiError(400, f'{name} come as {event} events: ask for stream_format "sse" with them', name)
    return req.marks, req.words


class Marks:
    """Sentence marks of one stream: see(chunk) -> the marks of the sentences it completes, each
    {"index", "text", "start", "end", "sample_rate"} (sample offsets in the stream's audio;
    None: the stream's end)."""

    def __init__(self) -> None:
        self.open: dict | None = None
        self.samples = 0

    def see(self, chunk) -> list[dict]:
        done = []
        if self.open is not None and (chunk is None or chunk.sentence != self.open["index"]):
            self.open["end"] = chunk.offset if chunk is not None else self.samples
            done.append(self.open)
            self.open = None
        if chunk is not None:
            if self.open is None:
                self.open = {"index": chunk.sentence, "text": chunk.text, "start": chunk.offset, "end": None,
                             "sample_rate": SAMPLE_RATE}
            self.samples = chunk.offset + len(chunk.audio)
        return done
