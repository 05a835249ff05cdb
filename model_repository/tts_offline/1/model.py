"""Triton adapter: the `tts` stream through BLS, chunks joined in CHUNK_INDEX order."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from velocity.serving.settings import Settings
from velocity.serving.lifecycle.stub_exit import end_quickly


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        Settings.from_env().configure_logging()
        end_quickly()                   # no interpreter teardown at unload (velocity.serving.lifecycle.stub_exit)
        self.inputs = [i["name"] for i in json.loads(args["model_config"])["input"]]   # passed on to `tts`

    def execute(self, requests: list) -> list:
        return [self._one(r) for r in requests]

    def _one(self, request):
        inputs = [t for n in self.inputs if (t := pb_utils.get_input_tensor_by_name(request, n)) is not None]
        # Checked first by text_frontend on its own (CHECK_ONLY: what is wrong comes back as
        # PROBLEM): an error from inside the ensemble, or any through BLS, loses its code
        # (INVALID_ARG would reach the client as INTERNAL). The front end is cheap next to
        # generation, and this model needs neither torch nor the front end itself.
        Err = pb_utils.TritonError
        check = pb_utils.InferenceRequest(model_name="text_frontend", requested_output_names=["PROBLEM"],
                                          inputs=inputs + [pb_utils.Tensor("CHECK_ONLY", np.ones((1, 1), np.bool_))]
                                          ).exec()
        if check.has_error():
            return pb_utils.InferenceResponse(error=Err(f"text_frontend: {check.error().message()}", Err.INTERNAL))
        problem = bytes(pb_utils.get_output_tensor_by_name(check, "PROBLEM").as_numpy().reshape(-1)[0]).decode()
        if problem:
            return pb_utils.InferenceResponse(error=Err(problem, Err.INVALID_ARG))
        bls = pb_utils.InferenceRequest(model_name="tts", requested_output_names=["WAVEFORM", "CHUNK_INDEX",
                                                                                  "REFINED_TEXT"], inputs=inputs)
        chunks, texts = {}, {}
        for resp in bls.exec(decoupled=True):
            if resp.has_error():
                return pb_utils.InferenceResponse(error=resp.error())
            wav = pb_utils.get_output_tensor_by_name(resp, "WAVEFORM")
            if wav is None:          # the empty final response
                continue
            idx = int(pb_utils.get_output_tensor_by_name(resp, "CHUNK_INDEX").as_numpy().reshape(-1)[0])
            chunks[idx] = wav.as_numpy().reshape(-1)
            text = pb_utils.get_output_tensor_by_name(resp, "REFINED_TEXT")
            texts[idx] = b"" if text is None else bytes(text.as_numpy().reshape(-1)[0])
        audio = np.concatenate([chunks[i] for i in sorted(chunks)]) if chunks else np.zeros(0, np.float32)
        refined = b" ".join(texts[i] for i in sorted(texts) if texts[i])        # each sentence's, in order
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("WAVEFORM", audio[None].astype(np.float32)),
                                                          pb_utils.Tensor("REFINED_TEXT", np.array([[refined]], object))])
