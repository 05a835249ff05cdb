"""Benchmarks: scripts that measure velocity-tts and write JSON and a PNG under docs/benchmarks/,
on one harness (benchmarks.harness). Not part of the clients: run them from the repository."""
