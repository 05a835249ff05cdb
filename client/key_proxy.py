"""A way in to Triton's gRPC port for a tool that cannot show the Triton key: perf_analyzer sends
no header on gRPC (its -H is for HTTP alone), and its --streaming, which `tts` needs, is gRPC
only. This listens on this machine's loopback and relays every call to the server, as bytes,
with the key added (velocity.serving.wire.triton_key); no other machine can reach it.
scripts/perf_analyzer.sh starts one when it is given a key.

    VELOCITY_TRITON_KEY=... python -m client.key_proxy --to host:8001 --port 18001
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import grpc

from velocity.serving.wire import triton_key

log = logging.getLogger("velocity.key_proxy")


def message_options() -> list[tuple[str, int]]:
    """tritonclient's message size limits, on both sides of the relay."""
    from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE
    return [("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE)]


class Relay(grpc.GenericRpcHandler):
    """Every method, unary or streaming, as a stream of raw messages each way, to the server's
    channel with the key in the call's metadata (a caller's own triton-grpc-protocol-* go)."""

    def __init__(self, channel: grpc.aio.Channel, key: str) -> None:
        self.channel, self.key = channel, key

    def service(self, details: grpc.HandlerCallDetails):
        call = self.channel.stream_stream(details.method)        # no (de)serializers: bytes through
        keep = tuple((k, v) for k, v in details.invocation_metadata or ()
                     if not k.startswith("triton-grpc-protocol-"))
        metadata = keep + ((triton_key.GRPC_HEADER, self.key),)

        async def relay(requests, context: grpc.aio.ServicerContext):
            upstream = call(requests, metadata=metadata)
            try:
                async for response in upstream:
                    yield response
            except grpc.aio.AioRpcError as e:                   # the server's error, as it said it
                await context.abort(e.code(), e.details() or "")
            finally:
                upstream.cancel()                                # the caller left: so does the call

        return grpc.stream_stream_rpc_method_handler(relay)


async def serve(to: str, port: int, key: str, ready=None) -> None:
    """Relay 127.0.0.1:port to `to` until cancelled; ready(port) once it listens (port 0: any)."""
    channel = grpc.aio.insecure_channel(to, options=message_options())
    server = grpc.aio.server(handlers=[Relay(channel, key)], options=message_options())
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    log.info("relaying 127.0.0.1:%d to %s with the Triton key", bound, to)
    if ready is not None:
        ready(bound)
    try:
        await server.wait_for_termination()
    finally:
        await server.stop(1)
        await channel.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--to", required=True, help="the server's gRPC address, host:port")
    ap.add_argument("--port", type=int, default=0, help="the loopback port to listen on (0: any; printed)")
    ap.add_argument("--key-file", help="a file holding the Triton key (default: $VELOCITY_TRITON_KEY)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[key-proxy] %(message)s")
    try:
        key = open(args.key_file).read().strip() if args.key_file else os.environ.get("VELOCITY_TRITON_KEY", "")
    except OSError as e:
        log.error("cannot read --key-file %s: %s", args.key_file, e.strerror)
        return 2
    if not key or key == triton_key.OPEN:
        log.error("no Triton key: give --key-file or VELOCITY_TRITON_KEY (a server without API keys needs "
                  "no proxy: point the tool at its gRPC port)")
        return 2
    try:
        asyncio.run(serve(args.to, args.port, key, lambda p: print(f"port {p}", flush=True)))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
