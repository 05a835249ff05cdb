"""The `tts` inputs as tritonclient tensors: each input's Triton and numpy type, and the [1, 1]
tensors of a request (shared by the gateway and the clients)."""
from __future__ import annotations

import numpy as np

# Input name -> (Triton datatype, numpy dtype)
INPUTS = {"TEXT": ("BYTES", object), "PROMPT": ("BYTES", object), "SPEAKER": ("BYTES", object),
          "SPEAKER_SEED": ("INT64", np.int64), "VOICE": ("BYTES", object),
          "TEMPERATURE": ("FP32", np.float32), "TOP_P": ("FP32", np.float32), "TOP_K": ("INT32", np.int32),
          "REPETITION_PENALTY": ("FP32", np.float32), "MAX_NEW_TOKENS": ("INT32", np.int32),
          "SEED": ("INT64", np.int64), "DECODER": ("BYTES", object),
          "SPEAKER_SAMPLE": ("BYTES", object), "SAMPLE_TEXT": ("BYTES", object),
          "REFINE_TEXT": ("BOOL", np.bool_), "REFINE_PROMPT": ("BYTES", object),
          "REFINE_TEMPERATURE": ("FP32", np.float32), "REFINE_TOP_P": ("FP32", np.float32),
          "REFINE_TOP_K": ("INT32", np.int32), "REFINE_REPETITION_PENALTY": ("FP32", np.float32),
          "REFINE_MAX_NEW_TOKENS": ("INT32", np.int32)}
AUDIO_MAGIC = (b"RIFF", b"fLaC", b"OggS", b"FORM")     # WAV, FLAC, Ogg, AIFF (as the server tells them apart)


def make_inputs(module, values: dict) -> list:
    """tritonclient InferInputs, each [1, 1], for the given TTS inputs (None values left out)."""
    return array_inputs(module, {name: np.array([[v.encode() if isinstance(v, str) else v]], dtype=INPUTS[name][1])
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
