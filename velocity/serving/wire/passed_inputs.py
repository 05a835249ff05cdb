"""Readers of the inputs the models pass each other (the request's own inputs are read by the
table in velocity.serving.wire.input_table), each checked: every error names the input and its allowed
range. And the sampling parameters as they travel between the models (PARAMS_F / PARAMS_I)."""
from __future__ import annotations

import numpy as np

from velocity.sampling_params import SamplingParams
from velocity.serving.wire.input_table import BY_NAME, Input


def text_input(value: np.ndarray | None, name: str, required: bool, max_chars: int | None = None) -> str | None:
    """A BYTES tensor holding one UTF-8 string (None: absent)."""
    return Input(name, "BYTES", "one UTF-8 string", max_chars=max_chars, required=required).read(value, None)


def flag_input(value: np.ndarray | None, name: str) -> bool:
    """An optional BOOL input (false when absent)."""
    return bool(Input(name, "BOOL", "").read(value, None))


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
    """DECODER, as the request table checks it: "hidden" (the default) or "codes"."""
    return BY_NAME["DECODER"].read(value, None) or BY_NAME["DECODER"].default


def input_reader(request, pb_utils):
    """get(name) -> the request's input as a numpy array, or None when it was not sent."""
    def get(name: str) -> np.ndarray | None:
        t = pb_utils.get_input_tensor_by_name(request, name)
        return None if t is None else t.as_numpy()
    return get
