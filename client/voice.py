"""velocity-tts-voice: a recording -> the sample string to send as SPEAKER_SAMPLE (offline, with the
release's DVAE encoder; the same string as the reference's Chat.sample_audio_speaker).

    velocity-tts-voice sample.wav "what the sample says" -o voice.txt
    velocity-tts-client "Hello there." --sample voice.txt --sample-text "what the sample says" -o out.wav
    velocity-tts-voice --blend "amber(2)+ash(1)" --add warm      # a blend of voices, saved as a voice
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    if importlib.util.find_spec("torch") is None:    # the release's DVAE encoder runs here, on torch
        print("velocity-tts-voice encodes with the release's DVAE, which needs the engine: "
              "pip install 'velocity-tts[engine]'", file=sys.stderr)
        return 2
    from velocity.serving.settings import Settings
    from velocity.tts.speaker import encode_sample
    from velocity.tts.audio_file import SAMPLE_RATE, read_audio
    from velocity.tts.voice_sample import VoiceEncoder
    from velocity.tts.voices import VOICES_FILE, add_voice

    ap = argparse.ArgumentParser(prog="velocity-tts-voice", description=__doc__.split("\n")[0])
    ap.add_argument("audio", nargs="?", help="the recording: WAV, FLAC, Ogg or AIFF, any rate (resampled to 24 kHz)")
    ap.add_argument("transcript", nargs="?", default="", help="what the recording says (send it as SAMPLE_TEXT)")
    ap.add_argument("-o", "--output", help="write the sample string to this file (default: print it)")
    ap.add_argument("--weights", default=None, help="the ChatTTS release folder (default: VELOCITY_WEIGHTS)")
    ap.add_argument("--add", metavar="NAME", help="add it as a named voice (VOICE=NAME) to the voices file")
    ap.add_argument("--voices", help="the voices file for --add (default: VELOCITY_VOICES, else <weights>/voices.json)")
    ap.add_argument("--blend", metavar="VOICES", help="no recording: blend the server's voices, such as "
                    "\"amber(2)+ash(1)\", into a speaker (print its string, or --add it as a voice)")
    args = ap.parse_args(argv)
    if (args.audio is None) == (args.blend is None):
        ap.error("give a recording or --blend (one of them)")
    settings = Settings.from_env()
    book = Path(args.voices or settings.voices or Path(args.weights or settings.weights) / VOICES_FILE)
    if args.blend:
        return save_blend(args, settings, book)
    try:
        data = Path(args.audio).read_bytes()
        enc = VoiceEncoder(args.weights or settings.weights, settings.max_sample_seconds)
        codes = enc.encode(read_audio(data, enc.max_seconds, args.audio))
        sample = encode_sample(codes)
        if args.output:
            Path(args.output).write_text(sample + "\n", encoding="utf-8")
        if args.add:
            add_voice(book, args.add, sample=sample, sample_text=args.transcript)
            print(f"added voice {args.add!r} to {book}; the server loads it at its next start", file=sys.stderr)
    except (OSError, ValueError) as e:
        print(f"velocity-tts-voice: {e}", file=sys.stderr)
        return 1
    if args.add and not args.output:
        return 0
    if not args.output:
        print(sample)
        return 0
    hint = f" with SAMPLE_TEXT {args.transcript!r}" if args.transcript else " (with its transcript as SAMPLE_TEXT)"
    print(f"wrote {args.output}: {codes.shape[1]} frames ({codes.shape[1] * 512 / SAMPLE_RATE:.2f} s); "
          f"send it as SPEAKER_SAMPLE{hint}", file=sys.stderr)
    return 0


def save_blend(args: argparse.Namespace, settings, book: Path) -> int:
    """--blend: the blend's speaker string printed (or written to -o), or added as a voice."""
    from velocity.tts.speaker import encode_speaker, load_speaker_stats, speaker_dim
    from velocity.tts.voices import Voices, add_voice

    weights = args.weights or settings.weights
    try:
        dim = speaker_dim(weights)
        voice = Voices(weights, dim, load_speaker_stats(weights, dim), str(book) if book.exists() else "").blend(args.blend)
        if args.add:
            add_voice(book, args.add, speaker=voice.speaker)
            print(f"added voice {args.add!r} ({args.blend}) to {book}; the server loads it at its next start",
                  file=sys.stderr)
        if args.output:
            Path(args.output).write_text(encode_speaker(voice.speaker) + "\n", encoding="utf-8")
        elif not args.add:
            print(encode_speaker(voice.speaker))
    except (OSError, ValueError) as e:
        print(f"velocity-tts-voice: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
