"""A TTS request as text_frontend and tts_offline read it: text, voice (speaker, random seed,
sample, or a named voice; the default voice otherwise), sampling, decode path and text refine."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from velocity.sampling_params import SamplingParams, chattts_params, refine_params
from velocity.serving.wire.input_table import read_inputs
from velocity.serving.wire.passed_inputs import input_reader
from velocity.serving.settings import Settings
from velocity.serving.lifecycle.stub_exit import end_quickly
from velocity.tts.word_timing import SAMPLE_RATE


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
    carry_prompts: list | None = None     # voice carry-over: each sentence's prompt, the first one's text as the sample's
    client: str = ""                      # who asks (CLIENT), for the engine's fair share
    speakers: list | None = None          # SSML's <voice>: each sentence's speaker vector (None: none)


@dataclass
class TTSFront:
    """What reading a TTS request needs: the settings, the text front end, the voice encoder (the
    DVAE's encoder side, for SPEAKER_SAMPLE recordings; None: samples as strings only) and the voices."""
    settings: Settings
    text: object                   # velocity.tts.frontend.TextFrontend
    encoder: object | None         # velocity.tts.voice_sample.VoiceEncoder
    voices: object                 # velocity.tts.voices.Voices

    @classmethod
    def from_env(cls, model: str, pb_utils) -> "TTSFront":
        """For a Triton model's initialize (TritonModelException saying what could not load)."""
        from velocity.tts.frontend import TextFrontend
        from velocity.tts.voice_sample import VoiceEncoder
        from velocity.tts.voices import Voices

        s = Settings.from_env()
        s.configure_logging()
        end_quickly()                   # no interpreter teardown at unload (velocity.serving.lifecycle.stub_exit)
        try:
            text = TextFrontend(s.weights, s.lexicon)
            return cls(s, text, VoiceEncoder(s.weights, s.max_sample_seconds),
                       Voices(s.weights, text.speaker_dim, text.speaker_stats, s.voices, s.default_voice))
        except Exception as e:
            raise pb_utils.TritonModelException(f"{model}: cannot load {s.weights}: {e}") from e


def parse_tts_request(get, front: TTSFront) -> TTSRequest:
    """get(name) -> np.ndarray | None for the inputs of velocity.serving.wire.input_table: TEXT, PROMPT, the
    voice (SPEAKER, SPEAKER_SEED, SPEAKER_SAMPLE with SAMPLE_TEXT, or VOICE), DECODER, the sampling
    inputs and text refine's.

    Raises ValueError naming the bad input and its allowed range (INVALID_ARG for Triton).
    """
    from velocity.tts.frontend import DEFAULT_PROMPT
    from velocity.tts.lexicon import Lexicon

    v, frontend = read_inputs(get, front.settings), front.text
    params = sampling(v, "", chattts_params, front.settings.max_new_tokens)
    vec, sample, sample_text = voice_inputs(v, front)
    prompt = v["PROMPT"] or DEFAULT_PROMPT
    lexicon = Lexicon.from_json(v["LEXICON"]) if v["LEXICON"] else None
    try:
        sentences, _ = frontend.encode(v["TEXT"], speaker=vec.size > 0, prompt=prompt, sample_text=sample_text,
                                       lexicon=lexicon, max_chars=front.settings.max_text_chars, ssml=bool(v["SSML"]))
    except ValueError as e:
        raise ValueError(f"TEXT: {e}" if str(e).startswith("SSML") else str(e)) from e
    if not sentences:
        raise ValueError("TEXT has nothing to speak after normalisation")
    req = TTSRequest(sentences, vec, params, v["DECODER"] or "hidden", sample, client=v["CLIENT"] or "")
    req.speakers = ssml_voices(sentences, vec, sample, front)
    if v["REFINE_TEXT"] and any(s.voice or s.speed is not None for s in sentences):
        raise ValueError("REFINE_TEXT cannot be combined with SSML's <voice> or <prosody rate> yet: send one of them")
    if v["REFINE_TEXT"]:
        req.refine = sampling(v, "REFINE_", refine_params)
        try:
            req.refine_prompts = [frontend.refine_prompt(s.text, v["REFINE_PROMPT"] or "") for s in sentences]
        except ValueError as e:
            raise ValueError(f"REFINE_{e}") from e       # "PROMPT must hold only control tokens ..."
        req.code_prefix = frontend.code_prefix(vec.size > 0, prompt, sample_text)
    carry = v["VOICE_CARRY_OVER"]
    if carry is None:
        carry = front.settings.voice_carry_over
    if carry and v["REFINE_TEXT"] and v["VOICE_CARRY_OVER"]:
        raise ValueError("VOICE_CARRY_OVER cannot be combined with REFINE_TEXT yet: send one of them")
    if carry and req.speakers is not None:
        if v["VOICE_CARRY_OVER"]:
            raise ValueError("VOICE_CARRY_OVER cannot be combined with SSML's <voice>: the first sentence's voice "
                             "would be every sentence's")
        carry = False
    if carry and sample is None and req.refine is None and len(sentences) > 1:
        req.carry_prompts = frontend.carried_prompts(sentences, vec.size > 0, prompt)
    return req


def ssml_voices(sentences: list, vec: np.ndarray, sample, front: TTSFront) -> list | None:
    """SSML's <voice>s: each sentence's speaker vector (the request's where it names none; None
    where the request has none), or None when no sentence names a voice. A voice cloned from a
    recording, or a request with a voice sample, cannot change voice (ValueError naming it)."""
    named = {s.voice for s in sentences if s.voice}
    if not named:
        return None
    if sample is not None:
        raise ValueError("TEXT: SSML's <voice> cannot be combined with a voice sample (SPEAKER_SAMPLE or a cloned "
                         "VOICE): send a speaker voice")
    vectors = {}
    for name in named:
        try:
            v = front.voices.get(name)
        except ValueError as e:
            raise ValueError(f"TEXT: SSML's <voice name={name!r}>: {e}") from e
        if v.cloned:
            raise ValueError(f"TEXT: SSML's <voice name={name!r}> is a voice cloned from a recording, which cannot "
                             "change in a request: name a speaker voice")
        vectors[name] = v.speaker
    return [vectors[s.voice] if s.voice else (vec if vec.size else None) for s in sentences]


def sampling(v: dict, prefix: str, defaults, max_new_tokens: int | None = None) -> SamplingParams:
    """A head's sampling inputs (prefix "" for the audio's, "REFINE_" for text refine's, already
    checked against their ranges) over the reference's defaults, with the request's SEED."""
    names = {"temperature": "TEMPERATURE", "top_p": "TOP_P", "top_k": "TOP_K",
             "repetition_penalty": "REPETITION_PENALTY", "max_new_tokens": "MAX_NEW_TOKENS"}
    given = {f: v[prefix + n] for f, n in names.items() if v[prefix + n] is not None}
    if max_new_tokens is not None:
        given.setdefault("max_new_tokens", max_new_tokens)
    return defaults(**given, seed=v["SEED"])


def voice_inputs(v: dict, front: TTSFront) -> tuple[np.ndarray, np.ndarray | None, str]:
    """The request's voice -> (speaker vector, empty for none; a sample's codes or None; its
    transcript). One of SPEAKER, SPEAKER_SEED, SPEAKER_SAMPLE (+ SAMPLE_TEXT) or VOICE; none of
    them: the default voice."""
    from velocity.tts.speaker import SpeakerError, decode_speaker, random_speaker

    frontend = front.text
    speaker, speaker_seed, voice = (v["SPEAKER"] or "").strip(), v["SPEAKER_SEED"], (v["VOICE"] or "").strip()
    sample = None if v["SPEAKER_SAMPLE"] is None else front.encoder.sample_codes(v["SPEAKER_SAMPLE"])
    sample_text = v["SAMPLE_TEXT"] or ""
    given = [n for n, x in (("SPEAKER", speaker), ("SPEAKER_SEED", speaker_seed is not None),
                            ("SPEAKER_SAMPLE", sample is not None), ("VOICE", voice)) if x]
    if voice and len(given) > 1:
        raise ValueError(f"VOICE names a whole voice: send it without {' and '.join(g for g in given if g != 'VOICE')}")
    if speaker and speaker_seed is not None:
        raise ValueError("give SPEAKER or SPEAKER_SEED, not both")
    vec = np.zeros(0, np.float32)
    if speaker_seed is not None:
        vec = random_speaker(speaker_seed, frontend.speaker_dim, frontend.speaker_stats)
    elif speaker:
        try:
            vec = decode_speaker(speaker, frontend.speaker_dim)
        except SpeakerError as e:
            raise ValueError(f"SPEAKER is not a valid speaker string: {e}") from e
    if given or not front.voices.default:
        if voice:
            return voice_of(front, front.voices.get(voice))
        return vec, sample, sample_text
    return voice_of(front, front.voices.get(front.voices.default))


def voice_of(front: TTSFront, v) -> tuple[np.ndarray, np.ndarray | None, str]:
    """A named voice (velocity.tts.voices.Voice) -> (speaker vector or empty, sample codes or None, transcript)."""
    vec = np.zeros(0, np.float32) if v.speaker is None else v.speaker
    if not v.sample:
        return vec, None, ""
    if front.encoder is None:
        raise ValueError(f"VOICE {v.name!r} is a voice sample, which this model cannot read")
    try:
        return vec, front.encoder.sample_codes(v.sample, f"VOICE {v.name!r}"), v.sample_text
    except ValueError as e:
        raise ValueError(f"VOICE {v.name!r} ({v.source}): {e}") from e


def sentence_pauses(sentences: list) -> np.ndarray:
    """SENTENCE_PAUSES [1, n + 1] int32: samples of silence before each sentence, then after the last."""
    ms = [s.pause for s in sentences] + [sentences[-1].after if sentences else 0]
    return (np.asarray(ms, np.int64) * (SAMPLE_RATE // 1000)).astype(np.int32)[None]


def sentence_speakers(req: TTSRequest, dim: int) -> np.ndarray:
    """SENTENCE_SPEAKERS [1, n * dim] float32 (a row of NaN: none), or [1, 0] when one speaker speaks all."""
    if req.speakers is None:
        return np.zeros((1, 0), np.float32)
    return np.concatenate([np.full(dim, np.nan, np.float32) if v is None else np.asarray(v, np.float32)
                           for v in req.speakers])[None]


def parse_triton_request(request, pb_utils, front: TTSFront) -> tuple[TTSRequest | None, object]:
    """-> (the checked request, None), or (None, an INVALID_ARG error response)."""
    get = input_reader(request, pb_utils)
    try:
        return parse_tts_request(get, front), None
    except ValueError as e:
        return None, pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG))
