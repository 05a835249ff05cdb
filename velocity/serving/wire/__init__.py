"""The contract between the models and their clients: the request table and its readers, the tensors
between the llm and the vocoder, what a client reads from a `tts` stream, the Triton key and the
CLIENT tag."""
