#!/usr/bin/env python
"""Text to a WAV file in one process (no server): front end, velocity, DVAE + Vocos.

    .venv/bin/python scripts/synthesize.py --weights checkpoints/demo-tiny --text "Hello world." --out hello.wav

With the demo checkpoint (random weights) the result is noise, not speech.
"""
import argparse
import logging
import time

import soundfile as sf

from velocity.tts.pipeline import TTSPipeline, chattts_params

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", required=True, help="a ChatTTS release folder (holding asset/)")
    ap.add_argument("--text", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--speaker-seed", type=int, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pipe = TTSPipeline(args.weights, device=args.device)
    t = time.perf_counter()
    audio = pipe.synthesize(args.text, speaker=args.speaker_seed,
                            params=chattts_params(seed=args.seed, max_new_tokens=args.max_new_tokens))
    took = time.perf_counter() - t
    sf.write(args.out, audio, pipe.sample_rate)
    secs = len(audio) / pipe.sample_rate
    logging.info("%s: %.2f s of audio in %.2f s (RTF %.2f)", args.out, secs, took, took / max(secs, 1e-9))
