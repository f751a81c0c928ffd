"""Frames and frame sizes as the Qwen models' own preprocessing chooses them.

The Qwen-VL models were trained on videos prepared by the ``qwen-vl-utils`` package
(``fetch_video``): a frame count from the video's length and a sampling rate (``fps``, clamped to
``min_frames`` .. ``max_frames``) or a fixed ``nframes``, always even; frames spread over the
video by ``linspace(0, total - 1, n)`` rounded; each frame resized by its ``smart_resize`` to sides
that are multiples of the merged patch, within ``min_pixels`` .. ``max_pixels`` and a per-video
``total_pixels`` shared by its frames. The temporal positions follow from the sampled rate
``n / total * fps``, which lvrl's frame metadata gives the processor as well.

lvrl calls the package's own functions (``smart_nframes``, ``smart_resize`` and its constants) for
all of it; only two lines of ``fetch_video`` have no function of their own and are restated here:
the readers' frame indices and the per-frame pixel cap derived from ``total_pixels``.
``tests/e2e/test_qwen_video_parity.py`` checks the result against ``fetch_video`` itself on
encoded videos. Video decoding stays lvrl's (PyAV, seeking to the sampled frames), so the package
is used without its readers (torchvision's ``read_video``, decord or torchcodec).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class QwenVideoSettings:
    """The keys of a ``qwen-vl-utils`` video element that choose frames and sizes; unset ones take
    the package's defaults (fps 2, 4 .. 768 frames, 128 .. 768 merged patches a frame, a total of
    ~90M pixels a video at 28-pixel patches)."""

    fps: float | None = None
    nframes: int | None = None
    min_frames: int | None = None
    max_frames: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    total_pixels: int | None = None

    def __post_init__(self) -> None:
        if self.fps is not None and self.nframes is not None:
            raise ValueError("qwen_video: give fps or nframes, not both (as qwen-vl-utils)")
        for name, value in asdict(self).items():
            if value is not None and value <= 0:
                raise ValueError(f"qwen_video.{name}={value} must be positive")

    def element(self) -> dict[str, Any]:
        """The settings as ``fetch_video``'s element keys (the unset ones left out)."""
        return {name: value for name, value in asdict(self).items() if value is not None}

    def frame_bound(self) -> int:
        """The most frames a video can give."""
        from qwen_vl_utils import vision_process as qwen

        if self.nframes is not None:
            return qwen.round_by_factor(self.nframes, qwen.FRAME_FACTOR)
        return qwen.floor_by_factor(self.max_frames or qwen.FPS_MAX_FRAMES, qwen.FRAME_FACTOR)

    def pixel_bound(self, factor: int) -> int:
        """The most pixels a frame's cap can allow at merged patches of ``factor`` pixels."""
        from qwen_vl_utils import vision_process as qwen

        ceiling = qwen.VIDEO_MAX_TOKEN_NUM * factor * factor
        capped = min(self.max_pixels, ceiling) if self.max_pixels is not None else ceiling
        min_pixels = self.min_pixels or qwen.VIDEO_MIN_TOKEN_NUM * factor * factor
        return max(capped, int(min_pixels * 1.05))


@dataclass(frozen=True)
class QwenVideoPlan:
    """What ``fetch_video`` would make of one video."""

    frame_indices: tuple[int, ...]
    height: int
    width: int
    sample_fps: float


def qwen_video_plan(
    settings: QwenVideoSettings, total_frames: int, video_fps: float, height: int, width: int, factor: int
) -> QwenVideoPlan:
    """The frames and frame size ``fetch_video`` chooses for a video of ``total_frames`` at
    ``video_fps`` and ``height x width``, merged patches of ``factor`` pixels (28 for Qwen2-VL and
    Qwen2.5-VL, 32 for Qwen3-VL). Raises ``ValueError`` where the package does (too few frames, an
    aspect ratio beyond 200)."""
    import torch
    from qwen_vl_utils import vision_process as qwen

    element = settings.element()
    count = qwen.smart_nframes(element, total_frames=total_frames, video_fps=video_fps)
    # The readers' indices: torch's float32 linspace, rounded half to even (the same rounding).
    indices = torch.linspace(0, total_frames - 1, count).round().long().tolist()
    sample_fps = count / max(total_frames, 1e-6) * video_fps
    min_pixels = element.get("min_pixels", qwen.VIDEO_MIN_TOKEN_NUM * factor * factor)
    total_pixels = element.get("total_pixels", qwen.MODEL_SEQ_LEN * factor * factor * 0.9)
    cap = max(
        min(qwen.VIDEO_MAX_TOKEN_NUM * factor * factor, total_pixels / count * qwen.FRAME_FACTOR),
        int(min_pixels * 1.05),
    )
    max_pixels = min(element.get("max_pixels", cap), cap)
    resized_height, resized_width = qwen.smart_resize(
        height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels
    )
    return QwenVideoPlan(tuple(indices), resized_height, resized_width, sample_fps)
