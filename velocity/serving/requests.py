"""Read and check the inputs of a TTS request; every error names the input and its allowed range."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from velocity.sampling_params import SamplingParams, chattts_params, refine_params
from velocity.serving.settings import Settings
from velocity.tts.speaker import sample_frames
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


@dataclass
class TTSRequest:
    """A checked TTS request: its sentences' token ids, speaker vector (empty: none), sampling,
    decode path ("hidden" | "codes")."""
    sentences: list
    speaker: np.ndarray
    params: SamplingParams
    decoder: str = "hidden"
    sample: np.ndarray | None = None      # a voice sample's codes [num_vq, T] (SPEAKER_SAMPLE)
    refine: SamplingParams | None = None  # text refine first (REFINE_TEXT), with these parameters
    refine_prompts: list | None = None    # per sentence: the text head's prompt
    code_prefix: list | None = None       # the audio prompt before a refined text


def parse_tts_request(get, settings: Settings, frontend, voices) -> TTSRequest:
    """get(name) -> np.ndarray | None for TEXT, PROMPT, SPEAKER or SPEAKER_SEED, SPEAKER_SAMPLE and
    SAMPLE_TEXT, DECODER and the sampling inputs; voices: a VoiceEncoder for samples.

    Raises ValueError naming the bad input and its allowed range (INVALID_ARG for Triton).
    """
    from velocity.tts.frontend import DEFAULT_PROMPT
    from velocity.tts.speaker import SpeakerError, decode_speaker, random_speaker

    text = text_input(get("TEXT"), "TEXT", required=True, max_chars=settings.max_text_chars)
    prompt = text_input(get("PROMPT"), "PROMPT", required=False) or DEFAULT_PROMPT
    speaker = text_input(get("SPEAKER"), "SPEAKER", required=False)
    params = sampling_inputs(get, settings)
    decoder = decoder_input(get("DECODER"))
    vec = np.zeros(0, np.float32)
    speaker_seed = seed_input(get, "SPEAKER_SEED")
    if speaker_seed is not None:
        if speaker and speaker.strip():
            raise ValueError("give SPEAKER or SPEAKER_SEED, not both")
        vec = random_speaker(speaker_seed, frontend.speaker_dim, frontend.speaker_stats)
    elif speaker and speaker.strip():
        try:
            vec = decode_speaker(speaker, frontend.speaker_dim)
        except SpeakerError as e:
            raise ValueError(f"SPEAKER is not a valid speaker string: {e}") from e
    sample, sample_text = sample_inputs(get, voices)
    sentences, _ = frontend.encode(text, speaker=vec.size > 0, prompt=prompt, sample_text=sample_text)
    if not sentences:
        raise ValueError("TEXT has nothing to speak after normalisation")
    req = TTSRequest(sentences, vec, params, decoder, sample)
    refine_prompt = text_input(get("REFINE_PROMPT"), "REFINE_PROMPT", required=False) or ""
    if flag_input(get("REFINE_TEXT"), "REFINE_TEXT"):
        req.refine = sampling_inputs(get, settings, "REFINE_", refine_params, max_new_tokens=REFINE_MAX_NEW_TOKENS)
        try:
            req.refine_prompts = [frontend.refine_prompt(s.text, refine_prompt) for s in sentences]
        except ValueError as e:
            raise ValueError(f"REFINE_{e}") from e       # "PROMPT must hold only control tokens ..."
        req.code_prefix = frontend.code_prefix(vec.size > 0, prompt, sample_text)
    elif refine_prompt:
        raise ValueError("REFINE_PROMPT is for text refine: send REFINE_TEXT true with it")
    return req


def sample_inputs(get, voices) -> tuple[np.ndarray | None, str]:
    """SPEAKER_SAMPLE (a sample string, or a WAV/FLAC/Ogg file's bytes) and SAMPLE_TEXT (its
    transcript) -> (codes [num_vq, T] or None, the transcript)."""
    raw = get("SPEAKER_SAMPLE")
    sample_text = text_input(get("SAMPLE_TEXT"), "SAMPLE_TEXT", required=False, max_chars=500) or ""
    if raw is None or raw.size == 0 or not raw.reshape(-1)[0]:
        if sample_text:
            raise ValueError("SAMPLE_TEXT is the transcript of SPEAKER_SAMPLE: send it with one")
        return None, ""
    if raw.size != 1 or raw.dtype != object:
        raise ValueError(f"SPEAKER_SAMPLE must be one BYTES value, got {raw.size} of {raw.dtype}")
    return voices.sample_codes(raw.reshape(-1)[0]), sample_text


def frontend_from_env(model: str, pb_utils) -> tuple[Settings, object, object]:
    """For a Triton model's initialize: the settings, the release's text front end and its voice
    encoder (the DVAE's encoder side, for SPEAKER_SAMPLE)."""
    from velocity.tts.frontend import TextFrontend
    from velocity.tts.voice_sample import VoiceEncoder

    settings = Settings.from_env()
    settings.configure_logging()
    try:
        return settings, TextFrontend(settings.weights), VoiceEncoder(settings.weights, settings.max_sample_seconds)
    except Exception as e:
        raise pb_utils.TritonModelException(f"{model}: cannot load {settings.weights}: {e}") from e


def input_reader(request, pb_utils):
    """get(name) -> the request's input as a numpy array, or None when it was not sent."""
    def get(name: str) -> np.ndarray | None:
        t = pb_utils.get_input_tensor_by_name(request, name)
        return None if t is None else t.as_numpy()
    return get


def parse_triton_request(request, pb_utils, settings: Settings, frontend, voices) -> tuple[TTSRequest | None, object]:
    """-> (the checked request, None), or (None, an INVALID_ARG error response)."""
    get = input_reader(request, pb_utils)
    try:
        return parse_tts_request(get, settings, frontend, voices), None
    except ValueError as e:
        return None, pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG))


@dataclass
class LLMInputs:
    """The llm's checked inputs: sentences' audio prompts (a sample's frames appended), speaker,
    sampling, and for text refine the text head's prompts, its sampling and the audio prefix."""
    sentences: list
    speaker: np.ndarray | None
    params: SamplingParams
    frames: list
    refine_prompts: list | None = None
    refine: SamplingParams | None = None
    code_prefix: list | None = None


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
                    params_from_arrays(need("PARAMS_F"), need("PARAMS_I"), max_new_tokens), frames)
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
    return out
