"""Encoding frames into video bytes with PyAV (synthetic videos, test and benchmark fixtures).

Decoding, the run-time half, is :mod:`datamodules.video`.
"""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np

CONTAINER_CODECS: dict[str, str] = {"mp4": "libx264", "webm": "libvpx-vp9", "mkv": "libx264"}
"""Default codec per container written by :func:`encode_video` (by file extension)."""
_CONTAINER_FORMATS = {"mp4": "mp4", "webm": "webm", "mkv": "matroska"}


def encode_video(frames: np.ndarray, fps: float, extension: str = "mp4", codec: str | None = None) -> bytes:
    """Encode uint8 RGB frames ``(T, H, W, 3)`` into ``mp4``, ``webm`` or ``mkv`` bytes (H, W even).

    The default codec per container is :data:`CONTAINER_CODECS`.
    """
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"expected uint8 frames (T, H, W, 3), got {frames.dtype} {frames.shape}")
    if extension not in _CONTAINER_FORMATS:
        raise ValueError(f"unknown container {extension!r}; expected one of {tuple(_CONTAINER_FORMATS)}")
    codec = codec or CONTAINER_CODECS[extension]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=_CONTAINER_FORMATS[extension]) as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        # One encoder thread: with several, libx264 output bytes vary from run to run, and the
        # synthetic shards must be byte-identical for a given seed.
        stream.codec_context.thread_count = 1
        if codec == "libx264":
            # Near-lossless and fast: the synthetic task's colours must survive compression.
            # Without the macroblock-tree rate control: with it, the same frames encoded to
            # different bytes from one encode to the next, one thread or not (a demo sample gave
            # two encodings in twelve; tests/unit/test_synthetic.py), so two data builds differed.
            stream.options = {"crf": "10", "preset": "veryfast", "x264-params": "mbtree=0"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def encode_mp4(frames: np.ndarray, fps: float, codec: str = "libx264") -> bytes:
    """Encode uint8 RGB frames ``(T, H, W, 3)`` into mp4 bytes (H, W even for yuv420p)."""
    return encode_video(frames, fps, "mp4", codec)
