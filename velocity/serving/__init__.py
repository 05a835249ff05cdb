"""What the Triton models share (docs/architecture.md, "4. Serving"), in rooms: wire (the
contract), front (the front end's request), llm (its streams and engine core), vocoder (its queue
and decoders), boards (between processes), lifecycle (drain, watchdog, health); the settings and
the metrics beside them."""
