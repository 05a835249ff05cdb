"""The llm model's inputs, as text_frontend makes them, checked (a direct caller's mistakes named)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from velocity.sampling_params import SamplingParams
from velocity.serving.wire.input_table import BY_NAME, REFINE_MAX_NEW_TOKENS
from velocity.serving.wire.passed_inputs import decoder_input, params_from_arrays
from velocity.serving.wire.protocol import MAX_SILENCE
from velocity.tts.speaker import sample_frames
from velocity.tts.word_timing import SentenceWords


@dataclass
class LLMInputs:
    """The llm's checked inputs: sentences' audio prompts (a sample's frames appended), speaker,
    sampling, and for text refine the text head's prompts, its sampling and the audio prefix."""
    sentences: list
    speaker: np.ndarray | None
    params: SamplingParams
    frames: list
    hidden: bool = True                   # the Decoder path (DECODER "hidden"): chunks carry hidden states
    refine_prompts: list | None = None
    refine: SamplingParams | None = None
    code_prefix: list | None = None
    texts: list[str] | None = None        # each sentence's text (SENTENCE_TEXTS), for the marks
    carry_prompts: list | None = None     # voice carry-over (CARRY_IDS): each sentence's prompt before the sample
    client: str = ""                      # who asks (CLIENT): the scheduler shares the batch between clients
    words: list | None = None             # each sentence's words to time (SENTENCE_WORDS: velocity.tts.word_timing)
    pauses: list[int] | None = None       # samples of silence before each sentence, then after the last (SENTENCE_PAUSES)
    speakers: list | None = None          # each sentence's speaker vector or None (SENTENCE_SPEAKERS: SSML's <voice>)


@dataclass(slots=True)
class LLMRequest:
    """One request of the llm model, as its stub starts it: the checked inputs, where its responses
    go (Triton's response sender) and whether its client left (its cancel check), whether the
    ensemble's vocoder follows (a stream board slot), its timeout in seconds (0: none), and whether
    it is a direct caller's (velocity.serving.llm.direct_callers)."""
    inputs: LLMInputs
    sender: object
    cancelled: Callable[[], bool]
    in_ensemble: bool = False
    timeout: float = 0.0
    direct: bool = False


def split_ids(ids: np.ndarray, lengths: np.ndarray, what: str) -> list[list[int]]:
    """Concatenated token ids and their lengths -> one list per sentence; ValueError naming the
    inputs (what: "TOKEN" for TOKEN_IDS and SENTENCE_LENGTHS, "REFINE" for REFINE_IDS/_LENGTHS)."""
    names = ("TOKEN_IDS", "SENTENCE_LENGTHS") if what == "TOKEN" else (f"{what}_IDS", f"{what}_LENGTHS")
    if ids.dtype.kind not in "iu" or lengths.dtype.kind not in "iu":
        raise ValueError(f"{names[0]} and {names[1]} must be integers")
    lengths = lengths.tolist()
    if not lengths or min(lengths) < 1 or sum(lengths) != ids.size:
        raise ValueError(f"{names[1]} must be positive and add up to the {ids.size} {names[0]}, "
                         f"got {lengths[:8]}{'...' if len(lengths) > 8 else ''}")
    bounds = np.cumsum([0] + lengths)
    return [ids[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])]


def llm_inputs(get, max_new_tokens: int, num_vq: int) -> LLMInputs:
    """The llm model's inputs (as text_frontend makes them), checked. A voice sample's codes
    (SAMPLE_CODES, [num_vq * T] codebook-major) follow every sentence's text as T audio frames.

    get(name) -> np.ndarray | None. Raises ValueError naming the input and its allowed range; the
    engine's own checks (token ids, speaker size, prompt length) run per sentence in the llm."""
    def need(name: str) -> np.ndarray:
        v = get(name)
        if v is None:
            raise ValueError(f"{name} is required")
        return v.reshape(-1)

    sentences = split_ids(need("TOKEN_IDS"), need("SENTENCE_LENGTHS"), "TOKEN")
    frames: list = []
    sample = get("SAMPLE_CODES")
    if sample is not None and sample.size:
        if sample.dtype.kind not in "iu" or sample.size % num_vq:
            raise ValueError(f"SAMPLE_CODES must be integers, {num_vq} per frame (codebook-major), "
                             f"got {sample.size} of {sample.dtype}")
        frames = sample_frames(sample.reshape(num_vq, -1))
    spk = need("SPEAKER_VECTOR").astype(np.float32, copy=True)
    out = LLMInputs([s + frames for s in sentences], spk if spk.size else None,
                    params_from_arrays(need("PARAMS_F"), need("PARAMS_I"), max_new_tokens), frames,
                    decoder_input(get("DECODER")) == "hidden")
    out.client = BY_NAME["CLIENT"].read(get("CLIENT"), None) or ""
    texts = get("SENTENCE_TEXTS")
    if texts is not None and texts.size:
        if texts.size != len(sentences):
            raise ValueError(f"SENTENCE_TEXTS holds {texts.size} texts, SENTENCE_LENGTHS {len(sentences)} sentences")
        out.texts = strings(texts)
    words = get("SENTENCE_WORDS")
    if words is not None and words.size:
        if words.size != len(sentences):
            raise ValueError(f"SENTENCE_WORDS holds {words.size} sentences, SENTENCE_LENGTHS {len(sentences)}")
        out.words = [SentenceWords.from_json(w) for w in strings(words)]
    out.pauses, out.speakers = sentence_pauses(get, len(sentences)), sentence_speakers(get, len(sentences), spk.size)
    carry = get("CARRY_IDS")
    if carry is not None and carry.size:
        if frames:
            raise ValueError("CARRY_IDS is for a request without a voice sample: SAMPLE_CODES is given")
        out.carry_prompts = split_ids(carry.reshape(-1), need("CARRY_LENGTHS"), "CARRY")
        if len(out.carry_prompts) != len(sentences):
            raise ValueError(f"CARRY_LENGTHS holds {len(out.carry_prompts)} sentences, SENTENCE_LENGTHS "
                             f"{len(sentences)}")
    refine = get("REFINE_IDS")
    if refine is not None and refine.size:
        out.refine_prompts = split_ids(refine.reshape(-1), need("REFINE_LENGTHS"), "REFINE")
        if len(out.refine_prompts) != len(sentences):
            raise ValueError(f"REFINE_LENGTHS holds {len(out.refine_prompts)} sentences, SENTENCE_LENGTHS "
                             f"{len(sentences)}")
        out.refine = params_from_arrays(need("REFINE_PARAMS_F"), need("REFINE_PARAMS_I"), REFINE_MAX_NEW_TOKENS,
                                        "REFINE_PARAMS")
        prefix = need("CODE_PREFIX")
        if prefix.dtype.kind not in "iu" or not prefix.size:
            raise ValueError("CODE_PREFIX must hold the audio prompt's token ids before the text")
        out.code_prefix = prefix.tolist()
        if out.carry_prompts is not None:
            raise ValueError("CARRY_IDS cannot be combined with REFINE_IDS")
    return out


def strings(v: np.ndarray) -> list[str]:
    """A BYTES tensor's strings, UTF-8 (a bad byte replaced)."""
    return [t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t) for t in v.reshape(-1)]


def sentence_pauses(get, n: int) -> list[int] | None:
    """SENTENCE_PAUSES: n + 1 silences in samples (before each sentence, after the last), or None."""
    v = get("SENTENCE_PAUSES")
    if v is None or not v.size or not v.any():
        return None
    if v.dtype.kind not in "iu" or v.size != n + 1 or v.min() < 0 or v.max() > MAX_SILENCE:
        raise ValueError(f"SENTENCE_PAUSES must hold {n + 1} silences in [0, {MAX_SILENCE}] samples (one before "
                         f"each sentence, one after the last), got {v.size} values in [{v.min()}, {v.max()}]")
    return v.reshape(-1).tolist()


def sentence_speakers(get, n: int, dim: int) -> list | None:
    """SENTENCE_SPEAKERS: a speaker vector per sentence (a row of NaN: none), or None: SPEAKER_VECTOR for all."""
    v = get("SENTENCE_SPEAKERS")
    if v is None or not v.size:
        return None
    if v.size % n or (dim and v.size != n * dim):
        raise ValueError(f"SENTENCE_SPEAKERS must hold one speaker vector per sentence ({n} x "
                         f"{dim or 'the speaker size'} floats), got {v.size}")
    rows = v.astype(np.float32).reshape(n, -1)
    return [None if np.isnan(r).all() else r.copy() for r in rows]


def check_prompts(inputs: LLMInputs, validate) -> None:
    """Each sentence's prompt, its text-refine prompt and its voice carry-over prompt, checked as
    the engine will check them (validate: the engine's): ValueError naming the input and the sentence."""
    for i, ids in enumerate(inputs.sentences):
        try:
            validate(ids, inputs.params)
            if inputs.refine is not None:
                validate(inputs.refine_prompts[i], inputs.refine, head="text")
        except ValueError as e:
            raise ValueError(f"TOKEN_IDS, sentence {i}: {e}") from e
    for i, ids in enumerate(inputs.carry_prompts or []):
        try:                      # the sample's frames are added once made: checked here without them
            validate(ids, inputs.params)
        except ValueError as e:
            raise ValueError(f"CARRY_IDS, sentence {i}: {e}") from e
