"""Video bytes in and out with PyAV: mp4 encoding, uniform frame sampling, resizing to a pixel budget.

Decoding keeps only the sampled frames, already resized, so host memory stays at
``num_frames x budget`` whatever the source resolution (host-RAM exhaustion is the most
common failure of long-video training).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

# Qwen2.5-VL sees 14x14 patches merged 2x2, so frame sides must be multiples of 28.
PATCH_FACTOR = 28


class VideoDecodeError(RuntimeError):
    """The video cannot be decoded into the requested frames (corrupt, truncated, empty)."""


@dataclass(frozen=True)
class SampledVideo:
    frames: np.ndarray
    """uint8 array ``(num_sampled, height, width, 3)`` in RGB."""
    fps: float
    """Frame rate of the source video."""
    total_num_frames: int
    """Frames in the source video."""
    frame_indices: tuple[int, ...]
    """Source index of each sampled frame."""

    @property
    def duration(self) -> float:
        return self.total_num_frames / self.fps

    @property
    def timestamps(self) -> tuple[float, ...]:
        """Time in seconds of each sampled frame."""
        return tuple(i / self.fps for i in self.frame_indices)

    @property
    def sampled_fps(self) -> float:
        """Rate of the sampled frames: what the model's temporal positions are based on."""
        return len(self.frame_indices) / self.duration


def fit_to_pixel_budget(
    height: int, width: int, max_pixels: int, factor: int = PATCH_FACTOR
) -> tuple[int, int]:
    """Largest ``(h, w)``, multiples of ``factor``, with ``h * w <= max_pixels`` and the aspect kept.

    Never upscales beyond the source size rounded to ``factor`` and never goes below one
    ``factor x factor`` cell.

    >>> fit_to_pixel_budget(56, 56, 56 * 56)
    (56, 56)
    >>> fit_to_pixel_budget(720, 1280, 128 * 28 * 28)
    (224, 420)
    """
    if max_pixels < factor * factor:
        raise ValueError(f"max_pixels={max_pixels} is below one {factor}x{factor} cell")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        scale = math.sqrt(max_pixels / (height * width))
        h = max(factor, math.floor(height * scale / factor) * factor)
        w = max(factor, math.floor(width * scale / factor) * factor)
    return h, w


def uniform_frame_indices(total_num_frames: int, num_frames: int) -> list[int]:
    """``num_frames`` indices spread evenly over ``total_num_frames`` (segment centres).

    Fewer frames are returned when the video is shorter; the count is always even (the
    model's temporal patch pairs frames), so a single-frame video yields ``[0, 0]``.

    >>> uniform_frame_indices(64, 8)
    [4, 12, 20, 28, 36, 44, 52, 60]
    >>> uniform_frame_indices(5, 8)
    [0, 1, 3, 4]
    """
    if total_num_frames <= 0:
        raise VideoDecodeError("the video has no frames")
    if num_frames < 2:
        raise ValueError("num_frames must be at least 2")
    if total_num_frames == 1:
        return [0, 0]
    count = min(num_frames, total_num_frames)
    count -= count % 2
    return [int((i + 0.5) * total_num_frames / count) for i in range(count)]


def encode_mp4(frames: np.ndarray, fps: float, codec: str = "libx264") -> bytes:
    """Encode uint8 RGB frames ``(T, H, W, 3)`` into mp4 bytes (H, W even for yuv420p)."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"expected uint8 frames (T, H, W, 3), got {frames.dtype} {frames.shape}")
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        # One encoder thread: with several, libx264 output bytes vary from run to run, and the
        # synthetic shards must be byte-identical for a given seed.
        stream.codec_context.thread_count = 1
        if codec == "libx264":
            # Near-lossless and fast: the synthetic task's colours must survive compression.
            stream.options = {"crf": "10", "preset": "veryfast"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def _count_frames(stream: av.video.stream.VideoStream) -> int:
    if stream.frames:
        return int(stream.frames)
    if stream.duration is not None and stream.time_base is not None and stream.average_rate:
        return max(1, round(float(stream.duration * stream.time_base * stream.average_rate)))
    return 0


def decode_video(source: bytes | str | Path, num_frames: int, max_pixels: int) -> SampledVideo:
    """Decode ``num_frames`` uniformly spaced frames, each resized to fit ``max_pixels``.

    Raises :class:`VideoDecodeError` for an unreadable, empty or truncated video (one that
    yields fewer frames than its header announces), never returns a partial result.
    """
    stream_source = io.BytesIO(source) if isinstance(source, bytes) else str(source)
    try:
        with av.open(stream_source) as container:
            if not container.streams.video:
                raise VideoDecodeError("no video stream")
            stream = container.streams.video[0]
            fps = float(stream.average_rate or stream.guessed_rate or 0)
            if fps <= 0:
                raise VideoDecodeError("unknown frame rate")
            total = _count_frames(stream)
            indices = uniform_frame_indices(total, num_frames)
            height, width = fit_to_pixel_budget(stream.height, stream.width, max_pixels)
            wanted: dict[int, int] = {}
            for idx in indices:
                wanted[idx] = wanted.get(idx, 0) + 1
            frames: list[np.ndarray] = []
            for position, frame in enumerate(container.decode(stream)):
                repeats = wanted.get(position, 0)
                if repeats:
                    rgb = frame.reformat(width=width, height=height, format="rgb24").to_ndarray()
                    frames.extend([rgb] * repeats)
                if len(frames) == len(indices):
                    break
    except VideoDecodeError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as err:
        raise VideoDecodeError(f"cannot decode video: {err}") from err
    if len(frames) != len(indices):
        raise VideoDecodeError(
            f"decoded {len(frames)} of {len(indices)} sampled frames (header says {total}): "
            "truncated or corrupt"
        )
    return SampledVideo(np.stack(frames), fps, total, tuple(indices))
