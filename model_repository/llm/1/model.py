"""Triton adapter: velocity's engine streaming ChatTTS audio in chunks.

Parse each request, then hand it to velocity.serving.llm.streams.Streams, whose engine core runs
in a process of its own (velocity.serving.llm.engine_core: the scheduler, the model, the sampler and
each stream's chunking, with a GIL of their own): its sentences are spoken in order as one stream
of chunks (the tensors of velocity.serving.wire.protocol, with the GPT's hidden states on the Decoder
path, DECODER "hidden", the default), answered by a response thread. Every request ends with the
final flag, errors too. A request of the tts ensemble (IN_ENSEMBLE) takes a slot on the stream
board, through which the vocoder tells of a client's cancel and of its progress
(velocity.serving.boards.stream_board). This process imports no torch.
"""
import json
import logging
import os
import signal

import triton_python_backend_utils as pb_utils

from velocity.serving.boards.core_board import board_path
from velocity.serving.llm.llm_inputs import LLMRequest, llm_inputs
from velocity.serving.metrics import LLM, make_metrics
from velocity.serving.wire.passed_inputs import flag_input, input_reader
from velocity.serving.wire.protocol import error_outputs
from velocity.serving.settings import Settings
from velocity.serving.boards.stream_board import StreamBoard
from velocity.serving.llm.streams import Streams
from velocity.serving.lifecycle.stub_exit import end_quickly

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
log = logging.getLogger("velocity.llm")


def send(sender, outputs: dict | None, final: bool) -> None:
    """One response: the tensors of a chunk, or only the final flag (outputs None)."""
    flags = FINAL if final else 0
    if outputs is None:
        sender.send(flags=flags)
    else:
        sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()]),
                    flags=flags)


def send_failure(sender, message: str, invalid: bool = True) -> None:
    """An error response that ends a request the llm did not start: the caller's mistake
    (INVALID_ARG) or our own fault (INTERNAL)."""
    code = pb_utils.TritonError.INVALID_ARG if invalid else pb_utils.TritonError.INTERNAL
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), flags=FINAL)


def exit_stub() -> None:
    """End this stub at once (the engine core died, its streams were told): the watchdog sees a
    part die and restarts the server (velocity.serving.lifecycle.watchdog)."""
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.settings = s = Settings.from_env()
        s.configure_logging()
        end_quickly()                   # no interpreter teardown at unload (velocity.serving.lifecycle.stub_exit)
        if not pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"])):
            raise pb_utils.TritonModelException("llm: its config.pbtxt must keep model_transaction_policy "
                                                "{ decoupled: true } (it streams many responses per request)")
        try:
            # what the vocoder tells the llm of each stream of the tts ensemble (cancel, progress)
            self.board = StreamBoard(board_path(s.run_dir, "streams"))
            self.streams = Streams(s, make_metrics(pb_utils, "llm", LLM), send, send_failure, self.board,
                                   exit_stub)          # starts the engine core, which loads the model
        except Exception as e:
            raise pb_utils.TritonModelException(f"llm: cannot start the engine on {s.weights}: {e}") from e

    def execute(self, requests: list) -> None:
        for request in requests:
            self._start(request)
        return None

    def _start(self, request) -> None:
        """Refuse, reject or start one request; every path ends it or leaves it in self.streams."""
        if refusal := self.streams.refusal():
            self._refuse(request, refusal)
            return
        try:
            get = input_reader(request, pb_utils)
            inputs = llm_inputs(get, self.settings.max_new_tokens, self.streams.num_vq)
            in_ensemble = flag_input(get("IN_ENSEMBLE"), "IN_ENSEMBLE")
        except ValueError as e:                  # what the caller sent
            send_failure(request.get_response_sender(), str(e))
            return
        except Exception as e:                   # our fault
            log.exception("llm: could not read a request")
            send_failure(request.get_response_sender(), f"llm: internal error ({e}); see the server log", False)
            return
        direct = self.streams.direct.is_direct(inputs)
        if direct and (refusal := self.streams.direct.refusal()):
            self._refuse(request, refusal)
            return
        # Triton's request timeout (microseconds, 0: none): the stream ends with an error after it
        self.streams.start(LLMRequest(inputs, request.get_response_sender(), request.is_cancelled, in_ensemble,
                                      request.timeout() / 1e6, direct))

    def _refuse(self, request, code: int) -> None:
        """End a request at once with a STREAM_* refusal (busy, draining, a dead part)."""
        self.streams.metrics["refused"].increment(1)
        send(request.get_response_sender(), error_outputs(code, self.streams.num_vq), final=True)

    def finalize(self) -> None:
        self.streams.close()                 # in-flight requests end with the final flag; the core stops
        self.board.close_file(unlink=True)
