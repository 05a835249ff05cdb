"""Four threads at the same metrics of velocity.serving.metrics at once, as the vocoder's execute
and decode threads are (its `dropped` counter and `backlog` gauge), published meanwhile: the
python backend's metrics are not thread-safe, and their race killed tritonserver
(tests/server/test_server_smoke.py)."""
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from velocity.serving.metrics import VOCODER, make_metrics

THREADS = 4


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        # published every 10 ms, from a thread beside the four: the publish path under load
        self.metrics = make_metrics(pb_utils, "metrics_threads", VOCODER).start(every=0.01)

    def execute(self, requests: list) -> list:
        out = []
        for request in requests:
            ops = int(pb_utils.get_input_tensor_by_name(request, "OPS").as_numpy().reshape(-1)[0])
            done = [0] * THREADS

            def hammer(k: int) -> None:
                for i in range(ops):
                    self.metrics["dropped"].increment(1)
                    self.metrics["backlog"].set(i)
                    done[k] += 1

            threads = [threading.Thread(target=hammer, args=(k,)) for k in range(THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("DONE", np.array([sum(done)], dtype=np.int32))]))
        return out
