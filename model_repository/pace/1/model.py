"""Triton adapter: the gateway's word of how far a client has read a stream, written to the stream
board (velocity.serving.boards.stream_board.StreamBoard.took), where the llm reads it. Free of torch."""
import numpy as np
import triton_python_backend_utils as pb_utils

from velocity.serving.boards.core_board import board_path
from velocity.serving.wire.input_table import Input
from velocity.serving.wire.passed_inputs import input_reader
from velocity.serving.settings import Settings
from velocity.serving.boards.stream_board import StreamBoard
from velocity.serving.lifecycle.stub_exit import end_quickly

STREAM = Input("STREAM", "INT64", "a stream's reference (the `tts` output STREAM)", lo=1, hi=2**63 - 1, required=True)
TAKEN = Input("TAKEN", "INT64", "frames of the stream's audio its client has read; -1: it keeps up",
              lo=-1, hi=2**31 - 1, required=True)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        s = Settings.from_env()
        s.configure_logging()
        end_quickly()                   # no interpreter teardown at unload (velocity.serving.lifecycle.stub_exit)
        self.board = StreamBoard(board_path(s.run_dir, "streams"))

    def execute(self, requests: list) -> list:
        return [self._one(r) for r in requests]

    def _one(self, request):
        get = input_reader(request, pb_utils)
        try:
            ref, taken = STREAM.read(get("STREAM"), None), TAKEN.read(get("TAKEN"), None)
        except ValueError as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG))
        known = self.board.took(int(ref), int(taken))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("KNOWN", np.array([[known]], bool))])

    def finalize(self) -> None:
        self.board.close_file()
