"""Triton adapter: text front end and request validation (velocity.tts.frontend, velocity.serving)."""
import numpy as np
import triton_python_backend_utils as pb_utils

from velocity.serving.wire.passed_inputs import flag_input, input_reader, params_arrays
from velocity.serving.front.tts_request import (TTSFront, parse_triton_request, parse_tts_request, sentence_pauses,
                                         sentence_speakers)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.front = TTSFront.from_env("text_frontend", pb_utils)

    def execute(self, requests: list) -> list:
        return [self._one(r) for r in requests]

    def _one(self, request):
        get = input_reader(request, pb_utils)
        if flag_input(get("CHECK_ONLY"), "CHECK_ONLY"):
            try:
                parse_tts_request(get, self.front)
                problem = ""
            except ValueError as e:
                problem = str(e)
            return pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("PROBLEM", np.array([[problem.encode()]], object))])
        req, error = parse_triton_request(request, pb_utils, self.front)
        if error is not None:
            return error
        sentences, vec, params = req.sentences, req.speaker, req.params
        sample = np.zeros((0,), np.int32) if req.sample is None else req.sample.astype(np.int32).reshape(-1)
        ids = np.concatenate([np.asarray(s.token_ids, np.int32) for s in sentences])[None]
        lengths = np.asarray([len(s.token_ids) for s in sentences], np.int32)[None]
        pf, pi = params_arrays(params)
        refine, carry = req.refine_prompts or [], req.carry_prompts or []
        rf, ri = params_arrays(req.refine or params)
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("REFINE_IDS", np.asarray([t for p in refine for t in p], np.int32)[None]),
            pb_utils.Tensor("REFINE_LENGTHS", np.asarray([len(p) for p in refine], np.int32)[None]),
            pb_utils.Tensor("REFINE_PARAMS_F", rf), pb_utils.Tensor("REFINE_PARAMS_I", ri),
            pb_utils.Tensor("CODE_PREFIX", np.asarray(req.code_prefix or [], np.int32)[None]),
            pb_utils.Tensor("CARRY_IDS", np.asarray([t for p in carry for t in p], np.int32)[None]),
            pb_utils.Tensor("CARRY_LENGTHS", np.asarray([len(p) for p in carry], np.int32)[None]),
            pb_utils.Tensor("TOKEN_IDS", ids), pb_utils.Tensor("SENTENCE_LENGTHS", lengths),
            pb_utils.Tensor("SENTENCE_TEXTS", np.array([[s.text.encode() for s in sentences]], object)),
            pb_utils.Tensor("SENTENCE_WORDS", np.array([[s.words.to_json().encode() for s in sentences]], object)),
            pb_utils.Tensor("SENTENCE_PAUSES", sentence_pauses(sentences)),
            pb_utils.Tensor("SENTENCE_SPEAKERS", sentence_speakers(req, self.front.text.speaker_dim)),
            pb_utils.Tensor("SPEAKER_VECTOR", vec[None]), pb_utils.Tensor("PARAMS_F", pf),
            pb_utils.Tensor("PARAMS_I", pi), pb_utils.Tensor("DECODER", np.array([[req.decoder.encode()]], object)),
            pb_utils.Tensor("SAMPLE_CODES", sample[None]),
            pb_utils.Tensor("CLIENT", np.array([[req.client.encode()]], object)),
            pb_utils.Tensor("IN_ENSEMBLE", np.ones((1, 1), np.bool_))])      # the llm's stream takes a board slot
