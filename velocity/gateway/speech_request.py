"""A speech request's body, read as the OpenAI API and our extensions have it: the `tts` inputs it
makes (triton_values, from the request table velocity.serving.input_table.INPUTS), its timeout, and
its sentence marks (Marks)."""
import json
import math

from velocity.gateway.encode import FORMATS
from velocity.gateway.upstream import ApiError
from velocity.serving.input_table import INPUTS, JSON
from velocity.tts.control import CONTROL

MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "chattts")   # listed; any model name with "tts" is taken
SAMPLE_RATE = 24000                  # the release's, what `tts` streams
TIMEOUT_HEADER = "x-request-timeout"  # seconds, as the body's "timeout"
MAX_TIMEOUT = 3600.0


def speed_prompt(speed: float) -> str:
    """OpenAI's speed (0.25-4.0, 1 = normal) -> ChatTTS's [speed_N] (0-9, 5 = normal):
    N = round(5 + 2 log2(speed)), so 0.25 -> 1, 0.5 -> 3, 1 -> 5, 2 -> 7, 4 -> 9."""
    return f"[speed_{min(9, max(0, round(5 + 2 * math.log2(speed))))}]"


def of_type(v, kind: type) -> bool:
    """A JSON value is of this kind (bool, int, str; float takes an int too); a bool is no number."""
    if isinstance(v, bool):
        return kind is bool
    return isinstance(v, (int, float) if kind is float else kind)


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


def request_timeout(body: dict, header: str | None) -> float | None:
    """The request's deadline in seconds (the body's `timeout`, else the X-Request-Timeout header)."""
    v = body.get("timeout", header)
    if v is None:
        return None
    try:
        t = float(v) if not isinstance(v, bool) else math.nan
    except (TypeError, ValueError):
        t = math.nan
    if not 0 < t <= MAX_TIMEOUT:
        raise ApiError(400, f"timeout must be seconds in (0, {MAX_TIMEOUT:.0f}], got {v!r}", "timeout")
    return t


def triton_values(body: dict, voices: dict[str, str], settings=None) -> tuple[dict, str, str]:
    """The request body -> (the `tts` inputs, response_format, stream_format); ApiError 400 naming
    the field and its allowed values. voices: the server's voice names -> their kind. Numbers are
    checked against their input's range (settings: the limits it names) before anything is cast."""
    def need(name: str, kind, allowed: str):
        v = body.get(name)
        if v is None or not of_type(v, kind):
            raise ApiError(400, f"{name} is required: {allowed}", name)
        return v

    model = need("model", str, f"one of {', '.join(MODELS)}")
    if model not in MODELS and "tts" not in model.lower():
        raise ApiError(400, f"model must be a speech model ({', '.join(MODELS)}, or any name with \"tts\"), "
                            f"got {model!r}", "model")
    text = need("input", str, "the text to speak")
    own = ", ".join(n for n, kind in voices.items() if kind != "alias")
    voice = need("voice", str, f"a voice ({own}) or a speaker string")
    fmt = body.get("response_format", "mp3")
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(FORMATS)}, got {fmt!r}", "response_format")
    stream_format = body.get("stream_format", "audio")
    if not isinstance(stream_format, str) or stream_format not in ("audio", "sse"):
        raise ApiError(400, f'stream_format must be "audio" or "sse", got {stream_format!r}', "stream_format")
    speed = body.get("speed", 1.0)
    if not of_type(speed, float) or not 0.25 <= speed <= 4.0:
        raise ApiError(400, f"speed must be a number in [0.25, 4.0], got {speed!r}", "speed")
    values: dict = {"TEXT": text, "PROMPT": speed_prompt(float(speed))}
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ApiError(400, f"instructions must be a string, got {instructions!r}", "instructions")
        values |= instruction_inputs(instructions)
    if voice in voices:
        values["VOICE"] = voice
    elif len(voice) > 32:                     # a speaker string (the release's are ~300 characters)
        values["SPEAKER"] = voice
    else:
        raise ApiError(400, f"voice {voice!r} is not a voice here; voices: {own}, OpenAI's names "
                            f"({', '.join(n for n, kind in voices.items() if kind == 'alias')}) or a speaker string",
                       "voice")
    for i in INPUTS:                          # our extras: the inputs with a body field
        v = body.get(i.api_field) if i.api_field else None
        if i.json and isinstance(v, (dict, list)):
            v = json.dumps(v, ensure_ascii=False)      # the object itself, as the input's JSON text
        if v is not None:
            if not of_type(v, JSON[i.dtype]):
                kind = "a JSON object (or its text)" if i.json else JSON[i.dtype].__name__
                raise ApiError(400, f"{i.api_field} must be {kind}, got {v!r}", i.api_field)
            if JSON[i.dtype] in (int, float):
                try:
                    i.check(v, settings, i.api_field)
                except ValueError as e:
                    raise ApiError(400, str(e), i.api_field) from e
            values[i.name] = v
    return values, fmt, stream_format


def marks_asked(body: dict, stream_format: str) -> bool:
    """The body's `marks` (our extension: speech.sentence events in the SSE stream)."""
    marks = body.get("marks", False)
    if not isinstance(marks, bool):
        raise ApiError(400, f"marks must be true or false, got {marks!r}", "marks")
    if marks and stream_format != "sse":
        raise ApiError(400, 'marks come as speech.sentence events: ask for stream_format "sse" with them', "marks")
    return marks


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
