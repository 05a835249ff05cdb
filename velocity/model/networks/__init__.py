"""The networks: the Llama body with paged attention, the ChatTTS GPT, the DVAE and the Decoder,
Vocos and its ConvNeXt blocks."""
