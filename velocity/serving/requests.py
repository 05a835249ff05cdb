"""Readers of request inputs, each checked: every error names the input and its allowed range.
And the sampling parameters as they travel between the models (PARAMS_F / PARAMS_I)."""
from __future__ import annotations

import numpy as np

from velocity.sampling_params import SamplingParams, chattts_params
from velocity.serving.settings import Settings
from velocity.tts.streaming import DECODERS

PARAM_INPUTS = ("TEMPERATURE", "TOP_P", "TOP_K", "REPETITION_PENALTY", "MAX_NEW_TOKENS", "SEED")
REFINE_MAX_NEW_TOKENS = 1024           # the text head's tokens per sentence (the reference's default: 384)


def text_input(value: np.ndarray | None, name: str, required: bool, max_chars: int | None = None) -> str | None:
    """A BYTES tensor holding one UTF-8 string."""
    if value is None or value.size == 0:
        if required:
            raise ValueError(f"{name} is required: one UTF-8 string")
        return None
    if value.size != 1:
        raise ValueError(f"{name} must hold exactly one string, got {value.size}")
    raw = value.reshape(-1)[0]
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError as e:
        raise ValueError(f"{name} must be UTF-8 text ({e})") from e
    if required and not text.strip():
        raise ValueError(f"{name} must not be empty or only whitespace")
    if max_chars is not None and len(text) > max_chars:
        raise ValueError(f"{name} has {len(text)} characters; the limit is {max_chars}")
    return text


def _scalar(value: np.ndarray | None, name: str, integer: bool = False):
    """One number from a tensor (None when absent); integer inputs must be integers."""
    if value is None or value.size == 0:
        return None
    if value.size != 1:
        raise ValueError(f"{name} must hold one value, got {value.size}")
    kinds = "iu" if integer else "iuf"
    if value.dtype.kind not in kinds:
        raise ValueError(f"{name} must be {'an integer' if integer else 'a number'}, got data type {value.dtype}")
    return value.reshape(-1)[0].item()


# input name -> SamplingParams field; the ranges are SamplingParams.validate's (plus the server's
# VELOCITY_MAX_NEW_TOKENS), its messages renamed to the input
SAMPLING_INPUTS = {"TEMPERATURE": "temperature", "TOP_P": "top_p", "TOP_K": "top_k",
                   "REPETITION_PENALTY": "repetition_penalty", "MAX_NEW_TOKENS": "max_new_tokens"}


def sampling_inputs(get, settings: Settings, prefix: str = "", defaults=chattts_params,
                    max_new_tokens: int | None = None) -> SamplingParams:
    """get(name) -> np.ndarray | None. The optional sampling inputs (named with `prefix`: "" for
    the audio's, "REFINE_" for text refine's) over the reference's defaults."""
    limit = max_new_tokens or settings.max_new_tokens
    values: dict = {"max_new_tokens": defaults().max_new_tokens if max_new_tokens else limit}
    for name, fld in SAMPLING_INPUTS.items():
        v = _scalar(get(prefix + name), prefix + name, integer=fld in ("top_k", "max_new_tokens"))
        if v is not None:
            values[fld] = v
    if not 1 <= values["max_new_tokens"] <= limit:
        raise ValueError(f"{prefix}MAX_NEW_TOKENS must be in [1, {limit}], got {values['max_new_tokens']}")
    values["seed"] = seed_input(get, "SEED")
    try:
        return defaults(**values)
    except ValueError as e:
        msg = str(e)
        for name, fld in SAMPLING_INPUTS.items():
            if msg.startswith(fld + " "):          # the input is already known to be an integer
                raise ValueError(prefix + name + msg[len(fld):].replace(" an integer ", " ")) from e
        raise


def flag_input(value: np.ndarray | None, name: str) -> bool:
    """An optional BOOL input (false when absent)."""
    if value is None or value.size == 0:
        return False
    if value.size != 1 or value.dtype.kind not in "biu":
        raise ValueError(f"{name} must be one BOOL, got {value.size} of {value.dtype}")
    return bool(value.reshape(-1)[0])


def params_arrays(p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """SamplingParams -> the wire's PARAMS_F [1, 3] and PARAMS_I [1, 3] (seed -1: none)."""
    return (np.asarray([[p.temperature, p.top_p, p.repetition_penalty]], np.float32),
            np.asarray([[p.top_k, p.max_new_tokens, -1 if p.seed is None else p.seed]], np.int64))


def params_from_arrays(pf: np.ndarray, pi: np.ndarray, max_new_tokens: int, what: str = "PARAMS") -> SamplingParams:
    """The wire's PARAMS_F/PARAMS_I (or REFINE_PARAMS_F/_I) -> SamplingParams, checked."""
    pf, pi = pf.reshape(-1), pi.reshape(-1)
    if pf.size != 3 or pi.size != 3 or pi.dtype.kind not in "iu":
        raise ValueError(f"{what}_F must hold [temperature, top_p, repetition_penalty] and {what}_I "
                         f"the integers [top_k, max_new_tokens, seed (-1: none)], got {pf.size} and {pi.size} values")
    (temp, top_p, rep), (top_k, max_new, seed) = pf.tolist(), pi.tolist()
    if not 1 <= max_new <= max_new_tokens:
        raise ValueError(f"{what}_I[1] (max_new_tokens) must be in [1, {max_new_tokens}], got {max_new}")
    if not -1 <= seed < 2**63:
        raise ValueError(f"{what}_I[2] (seed) must be -1 (none) or in [0, 2^63), got {seed}")
    try:
        return SamplingParams(temperature=temp, top_p=top_p, top_k=top_k, repetition_penalty=rep,
                              max_new_tokens=max_new, seed=None if seed < 0 else seed)
    except ValueError as e:
        raise ValueError(f"{what}_F/{what}_I: {e}") from e


def decoder_input(value: np.ndarray | None) -> str:
    """DECODER: "hidden" (the default: the GPT's hidden states through asset/Decoder.safetensors)
    or "codes" (the audio codes through the DVAE)."""
    name = text_input(value, "DECODER", required=False)
    name = "hidden" if name is None or not name.strip() else name.strip()
    if name not in DECODERS:
        raise ValueError(f'DECODER must be "hidden" (the default) or "codes", got {name!r}')
    return name


def seed_input(get, name: str) -> int | None:
    """An optional INT64 seed input, in [0, 2^63)."""
    v = _scalar(get(name), name, integer=True)
    if v is not None and not 0 <= v < 2**63:
        raise ValueError(f"{name} must be in [0, 2^63), got {v}")
    return None if v is None else int(v)


def input_reader(request, pb_utils):
    """get(name) -> the request's input as a numpy array, or None when it was not sent."""
    def get(name: str) -> np.ndarray | None:
        t = pb_utils.get_input_tensor_by_name(request, name)
        return None if t is None else t.as_numpy()
    return get
