"""The text front end's request: a `tts` request read and checked into prompts, voices and sampling."""
