"""Smoke-test model: streams COUNT responses (INDEX = 0..COUNT-1), then the final flag.

It imports torch and velocity so a passing test proves the stub sees the venv.
"""
import threading

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

import velocity

MAX_COUNT = 1000


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.torch_version = f"{torch.__version__} velocity {velocity.__version__}"
        self.threads: list[threading.Thread] = []

    def execute(self, requests: list) -> None:
        for request in requests:
            t = threading.Thread(target=self._stream, args=(request,), daemon=True)
            t.start()
            self.threads.append(t)
        self.threads = [t for t in self.threads if t.is_alive()]
        return None

    def _stream(self, request) -> None:
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy().reshape(-1)[0])
            if not 0 <= count <= MAX_COUNT:
                raise ValueError(f"COUNT must be in [0, {MAX_COUNT}], got {count}")
            for i in range(count):
                if request.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("INDEX", np.array([i], dtype=np.int32)),
                    pb_utils.Tensor("TORCH", np.array([self.torch_version.encode()], dtype=np.object_)),
                ]))
            sender.send(flags=final)
        except Exception as e:  # every request ends with the final flag, errors included
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))), flags=final)

    def finalize(self) -> None:
        for t in self.threads:
            t.join(timeout=10)
