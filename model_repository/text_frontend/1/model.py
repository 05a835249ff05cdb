"""Triton adapter: text front end and request validation (velocity.tts.frontend, velocity.serving)."""
import numpy as np
import triton_python_backend_utils as pb_utils

from velocity.serving.requests import parse_tts_request
from velocity.serving.settings import Settings
from velocity.tts.frontend import TextFrontend


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.settings = Settings.from_env()
        try:
            self.frontend = TextFrontend(self.settings.weights)
        except Exception as e:
            raise pb_utils.TritonModelException(f"text_frontend: cannot load {self.settings.weights}: {e}")

    def execute(self, requests: list) -> list:
        return [self._one(r) for r in requests]

    def _one(self, request):
        get = lambda name: (t.as_numpy() if (t := pb_utils.get_input_tensor_by_name(request, name)) is not None  # noqa: E731
                            else None)
        try:
            req = parse_tts_request(get, self.settings, self.frontend)
        except ValueError as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG))
        sentences, vec, params = req.sentences, req.speaker, req.params
        ids = np.concatenate([np.asarray(s.token_ids, np.int32) for s in sentences])[None]
        lengths = np.asarray([len(s.token_ids) for s in sentences], np.int32)[None]
        pf = np.asarray([[params.temperature, params.top_p, params.repetition_penalty]], np.float32)
        pi = np.asarray([[params.top_k, params.max_new_tokens, -1 if params.seed is None else params.seed]], np.int64)
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("TOKEN_IDS", ids), pb_utils.Tensor("SENTENCE_LENGTHS", lengths),
            pb_utils.Tensor("SPEAKER_VECTOR", vec[None]), pb_utils.Tensor("PARAMS_F", pf),
            pb_utils.Tensor("PARAMS_I", pi)])
