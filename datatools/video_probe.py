"""Probing a video before it goes into a shard: its headers, and frames decoded from first to last.

``lvrl data build`` probes every released video, so a damaged, truncated or overlong one is
rejected when the shards are built rather than skipped later at run time. Probing reads headers
and seeks with the run-time decoder's own functions (:mod:`datamodules.video`).
"""

from __future__ import annotations

from pathlib import Path

import av

from datamodules.video import VideoDecodeError, VideoInfo, frames_at, open_container, read_video_info

DEFAULT_PROBE_FRAMES = 16
"""Frames :func:`probe_video` decodes by default: spread over the video, so a damaged middle is found."""


class VideoTooLong(Exception):
    """The video's headers announce more than the allowed duration (nothing was decoded)."""


def probe_frame_indices(total_num_frames: int, count: int) -> list[int]:
    """``count`` frame indices spread evenly from the first to the last frame (both included).

    >>> probe_frame_indices(600, 4), probe_frame_indices(600, 2), probe_frame_indices(3, 16)
    ([0, 200, 399, 599], [0, 599], [0, 1, 2])
    """
    last = total_num_frames - 1
    if count <= 2 or last <= 0:
        return sorted({0, max(last, 0)})
    return sorted({round(i * last / (count - 1)) for i in range(count)})


def probe_video(
    source: bytes | str | Path, frames: int = DEFAULT_PROBE_FRAMES, *, max_seconds: float | None = None
) -> VideoInfo:
    """Read a video's headers and check that ``frames`` frames spread over it decode.

    The first and the last frame are always among them (``frames`` 0, 1 or 2: only those).
    Raises :class:`VideoDecodeError` for an unreadable, empty, truncated or damaged video,
    naming the time where decoding failed, and :class:`VideoTooLong` (before decoding) when
    the headers announce more than ``max_seconds``. Each probed frame costs a seek and a short
    decode from the keyframe before it, whatever the video's length.
    """
    with open_container(source) as container:
        stream, info = read_video_info(container)
        if max_seconds is not None and info.duration > max_seconds:
            raise VideoTooLong(f"{info.duration:,.0f} s of video; at most {max_seconds:,.0f} s")
        wanted = probe_frame_indices(info.num_frames, frames)
        decoded = 0
        try:
            for _ in frames_at(container, stream, info, wanted):
                decoded += 1
        except (VideoDecodeError, av.error.FFmpegError, OSError, ValueError, RuntimeError) as err:
            target = wanted[decoded]
            where = (
                f"between {wanted[decoded - 1] / info.fps:.2f} s and {target / info.fps:.2f} s"
                if decoded
                else "at 0.00 s"
            )
            raise VideoDecodeError(
                f"decoding fails {where} (on the way to frame {target} of {info.num_frames}): {err}"
            ) from err
    return info
