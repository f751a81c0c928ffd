"""Decoding video bytes with PyAV at run time: frame sampling, resizing to a pixel budget.

Decoding keeps only the sampled frames, already resized, so host memory stays at
``num_frames x budget`` whatever the source resolution or length (host-RAM exhaustion is the
most common failure of long-video training). Sampled frames are found by timestamp, and the
decoder seeks (to the keyframe before a frame) whenever the next sampled frame is far ahead,
so 64 frames of an hour-long video cost 64 short decodes, not 90,000 frames. Encoding and probing
are offline tools (:mod:`datatools.video_encode`, :mod:`datatools.video_probe`).
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from datamodules.qwen_video import QwenVideoSettings, qwen_video_plan

# Qwen2-VL and Qwen2.5-VL see 14x14 patches merged 2x2, so frame sides are multiples of 28 by
# default; Qwen3-VL's 16x16 patches want 32 (the model's family says: ``merged_patch_pixels``).
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


@dataclass(frozen=True)
class VideoInfo:
    """What a video's headers say, checked by decoding (see :func:`datatools.video_probe.probe_video`)."""

    fps: float
    num_frames: int
    """Frames in the video: the container's count, or duration x fps where it has none (webm, mkv)."""
    width: int
    height: int
    codec: str
    exact_count: bool
    """Whether ``num_frames`` comes from the container's frame count rather than its duration."""

    @property
    def duration(self) -> float:
        return self.num_frames / self.fps


# Where a container has no frame count, the duration-based estimate may be off by a frame or
# two; a sampled frame that far past the last decoded one still counts as found.
_ESTIMATE_SLACK_FRAMES = 2.0
# Seek rather than decode forward when the next sampled frame is more than this many frames
# ahead (and further than the decoder has had to walk from a keyframe after earlier seeks).
_SEEK_MIN_GAP_FRAMES = 48


@contextlib.contextmanager
def open_container(source: bytes | str | Path) -> Iterator[av.container.InputContainer]:
    """The open container; any decoder failure inside the block becomes a :class:`VideoDecodeError`."""
    try:
        with av.open(io.BytesIO(source) if isinstance(source, bytes) else str(source)) as container:
            yield container
    except VideoDecodeError:
        raise
    except (av.error.FFmpegError, OSError, ValueError, RuntimeError, AttributeError) as err:
        raise VideoDecodeError(f"cannot decode video: {err}") from err


def read_video_info(container: av.container.InputContainer) -> tuple[av.video.stream.VideoStream, VideoInfo]:
    """The first video stream and what its headers say; :class:`VideoDecodeError` if they are unusable."""
    if not container.streams.video:
        raise VideoDecodeError("no video stream")
    stream = container.streams.video[0]
    fps = float(stream.average_rate or stream.guessed_rate or 0)
    if not math.isfinite(fps) or fps <= 0:
        raise VideoDecodeError("unknown frame rate")
    exact = bool(stream.frames)
    if exact:
        count = int(stream.frames)
    else:
        if stream.duration is not None and stream.time_base is not None:
            seconds = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            seconds = container.duration / av.time_base
        else:
            raise VideoDecodeError("neither a frame count nor a duration in the headers")
        count = max(1, round(seconds * fps))
    context = stream.codec_context
    if context is None or not context.width or not context.height:
        raise VideoDecodeError("the video stream has no decoder or no frame size")
    return stream, VideoInfo(fps, count, context.width, context.height, context.name, exact)


def frames_at(
    container: av.container.InputContainer,
    stream: av.video.stream.VideoStream,
    info: VideoInfo,
    wanted: Sequence[int],
) -> Iterator[tuple[int, av.VideoFrame]]:
    """Yield ``(index, frame)`` for each distinct wanted frame index, ascending, seeking over gaps.

    A frame's index is its presentation time x fps (from the stream start), so seeking never
    loses count. Raises :class:`VideoDecodeError` when the stream ends before a wanted frame.
    """
    period = 1.0 / info.fps
    start = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
    slack = _ESTIMATE_SLACK_FRAMES if not info.exact_count else 0.5
    decoder: Iterator[av.VideoFrame] | None = None
    current: av.VideoFrame | None = None
    current_index = -1.0
    walk_from_keyframe = 0.0  # frames decoded after a seek before the wanted one, at most
    for index in sorted(set(wanted)):
        gap = index - current_index
        if decoder is None or gap > max(_SEEK_MIN_GAP_FRAMES, 2 * walk_from_keyframe):
            if decoder is not None or index > _SEEK_MIN_GAP_FRAMES:
                target = int((start + index * period) / stream.time_base)
                container.seek(target, stream=stream, backward=True, any_frame=False)
            decoder = container.decode(stream)
            current, current_index, seek_index = None, -1.0, None
        else:
            seek_index = -1.0  # no seek: not a measure of keyframe distance
        while current is None or current_index < index - 0.5:
            frame = next(decoder, None)
            if frame is None:
                break
            # Frames without a timestamp follow the previous one.
            seconds = frame.time
            current_index = (seconds - start) * info.fps if seconds is not None else current_index + 1
            current = frame
            if seek_index is None:
                seek_index = current_index
        if current is None or current_index < index - slack:
            raise VideoDecodeError(
                f"the stream ends before frame {index} (last decoded: {max(current_index, -1):.0f}; "
                f"the headers say {info.num_frames} frames): truncated or corrupt"
            )
        if seek_index is not None and seek_index >= 0:
            walk_from_keyframe = max(walk_from_keyframe, index - seek_index)
        yield index, current


def sampled_frame_count(total_num_frames: int, fps: float, num_frames: int, sample_fps: float | None) -> int:
    """How many frames to sample: ``num_frames``, or ``sample_fps`` per second capped at ``num_frames``.

    >>> sampled_frame_count(3600, 1.0, 64, None), sampled_frame_count(3600, 1.0, 64, 0.01)
    (64, 36)
    """
    if sample_fps is None:
        return num_frames
    if sample_fps <= 0:
        raise ValueError(f"sample_fps={sample_fps} must be positive")
    return max(2, min(num_frames, math.ceil(total_num_frames / fps * sample_fps)))


def decode_video(
    source: bytes | str | Path,
    num_frames: int,
    max_pixels: int,
    *,
    sample_fps: float | None = None,
    factor: int = PATCH_FACTOR,
    qwen: QwenVideoSettings | None = None,
) -> SampledVideo:
    """Decode frames spaced uniformly over the whole video, each resized to fit ``max_pixels``
    with sides that are multiples of ``factor``.

    Samples ``num_frames`` frames, or with ``sample_fps`` that many per second of video up to
    ``num_frames``. With ``qwen`` settings, the frames and their size are the ones Qwen's own
    preprocessing chooses (:mod:`datamodules.qwen_video`) instead, within ``num_frames`` and
    ``max_pixels``. Raises :class:`VideoDecodeError` for an unreadable, empty or truncated
    video (one that ends before a frame its header announces), or one that Qwen's rules cannot
    sample; never returns a partial result.
    """
    with open_container(source) as container:
        stream, info = read_video_info(container)
        if qwen is None:
            count = sampled_frame_count(info.num_frames, info.fps, num_frames, sample_fps)
            indices = uniform_frame_indices(info.num_frames, count)
            size = fit_to_pixel_budget(info.height, info.width, max_pixels, factor)
            return _decode_indices(container, stream, info, indices, size)
        try:
            plan = qwen_video_plan(qwen, info.num_frames, info.fps, info.height, info.width, factor)
        except ValueError as err:  # too few frames, an extreme aspect ratio
            raise VideoDecodeError(f"Qwen's video sampling refuses it: {err}") from err
        if min(plan.height, plan.width) < factor:  # its resize floors a side past a small total
            raise VideoDecodeError(
                f"Qwen's video sampling gives frames of {plan.width}x{plan.height}: a side of 0 pixels"
            )
        if len(plan.frame_indices) > num_frames or plan.height * plan.width > max_pixels:
            raise VideoDecodeError(
                f"Qwen's video sampling gives {len(plan.frame_indices)} frames of "
                f"{plan.width}x{plan.height}, "
                f"beyond num_frames {num_frames} or max_pixels {max_pixels}"
            )
        return _decode_indices(container, stream, info, plan.frame_indices, (plan.height, plan.width))


def decode_frames(
    source: bytes | str | Path, frame_indices: Sequence[int], max_pixels: int, *, factor: int = PATCH_FACTOR
) -> SampledVideo:
    """Decode the given source frames (ascending, distinct: a frame request's plan), resized as
    :func:`decode_video` does. Raises :class:`VideoDecodeError` as it does, and for an index
    outside the video."""
    indices = list(frame_indices)
    if not indices or indices != sorted(set(indices)):
        raise ValueError("frame indices must be distinct, ascending and at least one")
    with open_container(source) as container:
        stream, info = read_video_info(container)
        if indices[0] < 0 or indices[-1] >= info.num_frames:
            raise VideoDecodeError(
                f"frames {indices[0]}..{indices[-1]} asked of a video of {info.num_frames}"
            )
        size = fit_to_pixel_budget(info.height, info.width, max_pixels, factor)
        return _decode_indices(container, stream, info, indices, size)


def _decode_indices(
    container: av.container.InputContainer,
    stream: av.video.stream.VideoStream,
    info: VideoInfo,
    indices: Sequence[int],
    size: tuple[int, int],
) -> SampledVideo:
    height, width = size
    decoded = {
        index: frame.reformat(width=width, height=height, format="rgb24").to_ndarray()
        for index, frame in frames_at(container, stream, info, indices)
    }
    return SampledVideo(np.stack([decoded[i] for i in indices]), info.fps, info.num_frames, tuple(indices))
