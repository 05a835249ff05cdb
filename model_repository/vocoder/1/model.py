"""Triton adapter: DVAE + Vocos on one chunk (velocity.tts.streaming.AudioDecoder). Stateless."""
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from velocity.serving.requests import stream_error
from velocity.serving.settings import Settings
from velocity.tts.audio_models import load_dvae, load_vocos
from velocity.tts.streaming import AudioDecoder
from velocity.worker.worker import resolve_device


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.settings = s = Settings.from_env()
        s.set_threads("vocoder")
        try:
            dev = resolve_device(s.device)
            self.decoder = AudioDecoder(load_dvae(s.weights, dev), load_vocos(s.weights, dev))
        except Exception as e:
            raise pb_utils.TritonModelException(f"vocoder: cannot load {s.weights}: {e}")
        self.device = dev

    def execute(self, requests: list) -> list:
        out = []
        for r in requests:
            get = lambda n: pb_utils.get_input_tensor_by_name(r, n).as_numpy()  # noqa: E731
            index = int(get("CHUNK_INDEX").reshape(-1)[0])
            if index < 0:                     # the llm ended or refused the stream: its error code
                msg, unavailable = stream_error(index, self.settings)
                code = pb_utils.TritonError.UNAVAILABLE if unavailable else pb_utils.TritonError.INTERNAL
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(msg, code)))
                continue
            try:
                codes = torch.from_numpy(get("CODES").astype(np.int64)).to(self.device)     # [1, num_vq, T]
                ctx, length = int(get("CONTEXT").reshape(-1)[0]), int(get("LENGTH").reshape(-1)[0])
                if codes.dim() != 3 or not (0 <= ctx and length >= 1 and ctx + length <= codes.shape[-1]):
                    raise ValueError(f"CODES {tuple(codes.shape)} does not hold CONTEXT={ctx} + LENGTH={length} frames")
                audio = self.decoder.decode_chunk(codes, ctx, length).float().cpu().numpy()
                out.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("WAVEFORM", audio), pb_utils.Tensor("CHUNK_INDEX", get("CHUNK_INDEX"))]))
            except ValueError as e:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG)))
        return out
