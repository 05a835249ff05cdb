"""Speakers: the release's speaker strings (float16 bytes, raw LZMA2 (preset 9 | extreme),
base16384) and random speakers drawn from the release's speaker statistics."""
from __future__ import annotations

import json
import logging
import lzma
import re
import zipfile
from pathlib import Path

import numpy as np
import pybase16384 as b14

STATS_FILE = "asset/spk_stat.pt"       # published with the weights: [std, mean] of the speaker embeddings
log = logging.getLogger(__name__)

FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
# base16384's alphabet: 16384 characters from U+4E00 for the data, then at most one of U+3D00-U+3D0F
# saying how many bytes the last ones hold. pybase16384's decoder corrupts memory on some
# strings outside it (a later call then crashes the process): no other string reaches it.
ALPHABET = re.compile("[\u4e00-\u8dff]*[\u3d00-\u3d0f]?")


class SpeakerError(ValueError):
    """A speaker string or vector that cannot be used; the message says why."""


def _pack(data: bytes, header: bytes = b"") -> str:
    """header + raw LZMA2 (preset 9 | extreme) of data -> base16384: the release's string form."""
    return b14.encode_to_string(header + lzma.compress(data, format=lzma.FORMAT_RAW, filters=FILTERS))


def _unpack(s: str, what: str, header: int = 0) -> tuple[bytes, bytes]:
    """The string form -> (its first `header` bytes, the rest decompressed); SpeakerError naming
    `what` if malformed."""
    if not isinstance(s, str) or not s.strip():
        raise SpeakerError(f"{what} is empty")
    s = s.strip()
    if not ALPHABET.fullmatch(s):
        i = next(i for i, c in enumerate(s) if not ("\u4e00" <= c <= "\u8dff"
                                                    or "\u3d00" <= c <= "\u3d0f" and i == len(s) - 1))
        raise SpeakerError(f"{what} is not base16384: character {i} is U+{ord(s[i]):04X}, outside its alphabet")
    try:
        raw = b14.decode_from_string(s)
    except Exception as e:
        raise SpeakerError(f"{what} is not base16384 ({e})") from e
    if len(raw) < header:
        raise SpeakerError(f"{what} is too short ({len(raw)} bytes)")
    try:
        return raw[:header], lzma.decompress(raw[header:], format=lzma.FORMAT_RAW, filters=FILTERS)
    except lzma.LZMAError as e:
        raise SpeakerError(f"{what} does not hold LZMA2 data ({e})") from e


def encode_speaker(vec: np.ndarray) -> str:
    """A speaker vector -> the release's string form."""
    return _pack(np.asarray(vec, dtype=np.float16).tobytes())


def decode_speaker(s: str, dim: int = 768) -> np.ndarray:
    """The release's string form -> a float32 vector of `dim` values; SpeakerError if malformed."""
    _, data = _unpack(s, "speaker string")
    if len(data) != 2 * dim:
        raise SpeakerError(f"speaker string holds {len(data) // 2} float16 values, expected {dim}")
    vec = np.frombuffer(data, dtype=np.float16).astype(np.float32)
    if not np.isfinite(vec).all():
        raise SpeakerError("speaker string holds NaN or inf values")
    return vec


def encode_sample(codes: np.ndarray) -> str:
    """A voice sample's audio codes [num_vq, T] -> the reference's sample string (its `spk_smp`):
    the shape as two little-endian uint16, then the codes as uint16 compressed like a speaker."""
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise SpeakerError(f"sample codes must be [codebooks, frames], got shape {codes.shape}")
    return _pack(codes.astype("<u2").tobytes(), header=np.array(codes.shape, dtype="<u2").tobytes())


def decode_sample(s: str, num_vq: int, num_codes: int, max_frames: int) -> np.ndarray:
    """A sample string -> codes [num_vq, T] (int64); SpeakerError naming what is wrong."""
    head, data = _unpack(s, "SPEAKER_SAMPLE string", header=4)
    rows, frames = np.frombuffer(head, dtype="<u2").tolist()
    if rows != num_vq or not 1 <= frames <= max_frames:
        raise SpeakerError(f"SPEAKER_SAMPLE string holds [{rows}, {frames}] codes; the model takes "
                           f"[{num_vq}, 1..{max_frames}]")
    if len(data) != 2 * rows * frames:
        raise SpeakerError(f"SPEAKER_SAMPLE string holds {len(data) // 2} codes, its shape says {rows * frames}")
    codes = np.frombuffer(data, dtype="<u2").reshape(rows, frames).astype(np.int64)
    if int(codes.max()) >= num_codes:
        raise SpeakerError(f"SPEAKER_SAMPLE string holds code {int(codes.max())}; codes are in [0, {num_codes})")
    return codes


def sample_frames(codes) -> list[tuple[int, ...]]:
    """A voice sample's codes [num_vq, T] -> the T audio frames the reference appends to every
    prompt after its text (the engine embeds each as the sum of its codes' embeddings)."""
    return [tuple(int(c) for c in frame) for frame in codes.T]


def speaker_dim(folder: str | Path) -> int:
    """A speaker vector's size: the GPT's hidden size (asset/gpt/config.json; the release's 768)."""
    cfg = Path(folder) / "asset" / "gpt" / "config.json"
    return json.loads(cfg.read_text(encoding="utf-8")).get("hidden_size", 768) if cfg.is_file() else 768


def load_speaker_stats(folder: str | Path, dim: int) -> np.ndarray | None:
    """asset/spk_stat.pt -> [2, dim] float16 (std, mean), or None when the folder lacks it.

    The file is a torch.save zip of one tensor of 2 * dim values; its raw storage bytes
    (<name>/data/0, little-endian float32 or float16) are read directly, never unpickled."""
    path = Path(folder) / STATS_FILE
    if not path.is_file():
        return None
    try:
        with zipfile.ZipFile(path) as z:
            blobs = [n for n in z.namelist() if re.fullmatch(r"[^/]+/data/\d+", n)]
            if len(blobs) != 1:
                raise SpeakerError(f"{path}: expected one tensor in the torch.save archive, found {len(blobs)}")
            raw = z.read(blobs[0])
    except zipfile.BadZipFile as e:
        raise SpeakerError(f"{path}: not a torch.save zip archive ({e})") from e
    for dtype in ("<f4", "<f2"):
        if len(raw) == 2 * dim * np.dtype(dtype).itemsize:
            stats = np.frombuffer(raw, dtype=dtype).astype(np.float16).reshape(2, dim)
            if not np.isfinite(stats).all():
                raise SpeakerError(f"{path}: holds NaN or inf values")
            return stats
    raise SpeakerError(f"{path}: expected {2 * dim} float32 or float16 values (std, mean), got {len(raw)} bytes")


def random_speaker(seed: int, dim: int = 768, stats: np.ndarray | None = None) -> np.ndarray:
    """A random speaker from a seed, as the reference draws one (Speaker._sample_random after
    torch.manual_seed(seed)): randn(dim) * std + mean, all in float16 on torch's CPU generator.
    stats: [2, dim] (std, mean) from load_speaker_stats; None: std 1, mean 0 (a plain normal,
    for folders without asset/spk_stat.pt). Returns float32 holding float16 values."""
    import torch        # here alone: the voices model reads speaker strings without it

    v = torch.randn(dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float16)
    if stats is not None:
        st = torch.from_numpy(np.asarray(stats, dtype=np.float16))
        if st.shape != (2, dim):
            raise SpeakerError(f"speaker statistics must be [2, {dim}] (std, mean), got {list(st.shape)}")
        v = v.mul_(st[0]).add_(st[1])
    return v.float().numpy()
