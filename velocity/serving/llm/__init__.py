"""The llm model's requests: their inputs, one stream as the stub holds it, the streams, direct
callers' share, and the engine core in a process of its own."""
