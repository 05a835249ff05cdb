"""Triton adapter: the named voices (velocity.tts.voices), listed as JSON, with whether the server
drains (serve.sh's stop under way): the gateway's /health says 503 then."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from velocity.serving.lifecycle.drain import draining
from velocity.serving.wire.passed_inputs import input_reader, text_input
from velocity.serving.settings import Settings
from velocity.serving.lifecycle.stub_exit import end_quickly


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        from velocity.tts.speaker import speaker_dim
        from velocity.tts.voices import Voices

        self.settings = s = Settings.from_env()
        s.configure_logging()
        end_quickly()                   # no interpreter teardown at unload (velocity.serving.lifecycle.stub_exit)
        try:
            # names, kinds and sources only: no built-in voice's vector, so no torch in this stub
            self.voices = Voices(s.weights, speaker_dim(s.weights), None, s.voices, s.default_voice, draw=False)
        except Exception as e:
            raise pb_utils.TritonModelException(f"voices: cannot load the voices of {s.weights}: {e}") from e

    def execute(self, requests: list) -> list:
        return [self._one(r) for r in requests]

    def _one(self, request):
        try:
            name = (text_input(input_reader(request, pb_utils)("NAME"), "NAME", required=False) or "").strip()
            listing = self.voices.listing() | {"draining": draining(self.settings.run_dir)}
            if name:
                self.voices.get(name)                    # ValueError listing the names
                listing["voices"] = [v for v in listing["voices"] if v["name"] == name]
        except ValueError as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG))
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("VOICES", np.array([json.dumps(listing).encode()], object))])
