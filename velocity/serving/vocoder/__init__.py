"""The vocoder's side: its queue of chunks, its jobs and refusals, and each stream's stateful decoder."""
