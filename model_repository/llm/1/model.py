"""Triton adapter: velocity's AsyncLLMEngine streaming ChatTTS audio in chunks.

Parse and check each request, then hand it to velocity.serving.stream_host.Streams: its sentences
are spoken in order as one stream of chunks (the tensors of velocity.serving.protocol, with the
GPT's hidden states on the Decoder path, DECODER "hidden", the default), answered by a response
thread, not the engine loop. Every request ends with the final flag, errors too. A request of
the tts ensemble (IN_ENSEMBLE) takes a slot on the stream board, through which the vocoder tells
of a client's cancel and of its progress (velocity.serving.stream_board).
"""
import json
import logging

import triton_python_backend_utils as pb_utils

from velocity.sampling_params import SamplingParams
from velocity.serving.core_board import CoreBoard, ThreadLender, board_path
from velocity.serving.metrics import LLM, make_metrics
from velocity.serving.protocol import error_outputs
from velocity.serving.passed_inputs import decoder_input, flag_input, input_reader
from velocity.serving.settings import Settings
from velocity.serving.stub_exit import end_quickly
from velocity.serving.stream_host import Streams
from velocity.serving.stream_board import StreamBoard
# torch and the engine are imported in initialize: where Triton's auto-complete is on (a bare
# tritonserver; serve.sh turns it off) it runs this file in a stub of its own, which needs none of them

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


def send_failure(sender, message: str, code) -> None:
    """An error response that ends a request the llm did not start (direct callers only)."""
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), flags=FINAL)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import torch

        from velocity import AsyncLLMEngine
        from velocity.device import resolve_device
        from velocity.tts.frontend import TextFrontend

        self.settings = s = Settings.from_env()
        s.configure_logging()
        end_quickly()                   # no interpreter teardown at unload (velocity.serving.stub_exit)
        if not pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"])):
            raise pb_utils.TritonModelException("llm: its config.pbtxt must keep model_transaction_policy "
                                                "{ decoupled: true } (it streams many responses per request)")
        own = s.set_threads("llm")
        self.lender, self.cores = None, None
        try:
            if s.lend_vocoder_cores and resolve_device(s.device).type == "cpu":
                # all cores while no vocoder decodes (velocity.serving.core_board)
                self.cores = CoreBoard(board_path(s.run_dir))
                self.lender = ThreadLender(self.cores, own, s.threads_lent(own), torch.set_num_threads)
            self.engine = AsyncLLMEngine(s.engine_config(), before_step=self.lender)
            self.frontend = TextFrontend(s.weights)          # the tokenizer, for text refine
            # what the vocoder tells the llm of each stream of the tts ensemble (cancel, progress)
            self.board = StreamBoard(board_path(s.run_dir, "streams"))
            self._carrier = None
            if s.voice_carry_over:
                self.carrier()
        except Exception as e:
            raise pb_utils.TritonModelException(f"llm: cannot start the engine on {s.weights}: {e}") from e
        self.streams = Streams(self.engine, s, make_metrics(pb_utils, "llm", LLM), send, self.lender, self.board)

    def execute(self, requests: list) -> None:
        for request in requests:
            self._start(request)
        return None

    def _start(self, request) -> None:
        """Refuse, reject or start one request; every path ends it or leaves it in self.streams."""
        if refusal := self.streams.refusal():
            self.streams.metrics["refused"].increment(1)
            send(request.get_response_sender(), error_outputs(refusal, self.streams.num_vq), final=True)
            return
        try:
            get = input_reader(request, pb_utils)
            sentences, speaker, params, hidden, refine, texts, carry = self._parse(get)
            in_ensemble = flag_input(get("IN_ENSEMBLE"), "IN_ENSEMBLE")
        except ValueError as e:                  # what the caller sent
            send_failure(request.get_response_sender(), str(e), pb_utils.TritonError.INVALID_ARG)
            return
        except Exception as e:                   # our fault
            log.exception("llm: could not read a request")
            send_failure(request.get_response_sender(), f"llm: internal error ({e}); see the server log",
                         pb_utils.TritonError.INTERNAL)
            return
        # Triton's request timeout (microseconds, 0: none): the stream ends with an error after it
        self.streams.start(request.get_response_sender(), request.is_cancelled, sentences, speaker, params, hidden,
                           refine, in_ensemble, request.timeout() / 1e6, texts, carry)

    def _parse(self, get) -> tuple[list, object, SamplingParams, bool, object, list | None, object]:
        """The request's sentences, speaker, sampling, whether it takes the Decoder path, its text
        refine (or None), its sentences' texts (or None) and its voice carry-over (or None), checked
        as the engine will check them. get: its input reader."""
        import torch

        from velocity.serving.llm_request import check_prompts, llm_inputs

        inputs = llm_inputs(get, self.settings.max_new_tokens, self.streams.num_vq)
        sentences, spk, params = inputs.sentences, inputs.speaker, inputs.params
        check_prompts(inputs, self.engine.validate)
        refine = None if inputs.refine is None else self.frontend.refine_plan(
            inputs.refine_prompts, inputs.refine, inputs.code_prefix, inputs.frames)
        speaker = None
        if spk is not None:
            try:               # checked and normalised once: every sentence reuses it
                speaker = self.engine.model.check_speaker(torch.from_numpy(spk))
            except ValueError as e:
                raise ValueError(f"SPEAKER_VECTOR: {e}") from e
        carry = None if inputs.carry_prompts is None else self.carrier().plan(inputs.carry_prompts)
        return sentences, speaker, params, decoder_input(get("DECODER")) == "hidden", refine, inputs.texts, carry

    def carrier(self):
        """Voice carry-over's decoders and voice encoder (velocity.tts.carry_over), on the CPU: loaded
        at initialize under VELOCITY_VOICE_CARRY_OVER=1, else at the first request that asks."""
        from velocity.tts.carry_over import VoiceCarrier

        if self._carrier is None:
            self._carrier = VoiceCarrier.load(self.settings.weights)
            log.info("voice carry-over: the decoders and the voice encoder are loaded")
        return self._carrier

    def finalize(self) -> None:
        self.streams.close()                 # in-flight requests end with the final flag
        self.board.close_file(unlink=True)
        if self.cores is not None:
            self.cores.close(unlink=True)
