"""PyAV encoding/decoding, uniform sampling and the pixel budget (datamodules/video.py)."""

import numpy as np
import pytest

from datamodules.video import (
    VideoDecodeError,
    decode_video,
    encode_mp4,
    fit_to_pixel_budget,
    uniform_frame_indices,
)


def _ramp_video(num_frames: int = 40, height: int = 84, width: int = 112) -> np.ndarray:
    # Frame i is filled with grey level 5*i, so a decoded frame tells which source frame it was.
    levels = (np.arange(num_frames) * 5).astype(np.uint8)
    return np.broadcast_to(levels[:, None, None, None], (num_frames, height, width, 3)).copy()


def test_decode_samples_the_right_frames_at_the_right_size():
    data = encode_mp4(_ramp_video(), fps=4.0)
    video = decode_video(data, num_frames=8, max_pixels=56 * 56)
    # 84x112 scaled into 56*56 pixels at multiples of 28, aspect kept: 28x56.
    assert video.frames.shape == (8, 28, 56, 3)
    assert video.total_num_frames == 40 and video.fps == pytest.approx(4.0)
    assert list(video.frame_indices) == uniform_frame_indices(40, 8)
    grey = video.frames.reshape(8, -1).mean(axis=1)
    np.testing.assert_allclose(grey, np.array(video.frame_indices) * 5, atol=3)
    assert video.sampled_fps == pytest.approx(8 / 10.0)
    assert video.timestamps[1] == pytest.approx(video.frame_indices[1] / 4.0)


def test_pixel_budget_keeps_aspect_and_never_exceeds():
    for h, w, budget in [(720, 1280, 128 * 28 * 28), (56, 56, 3136), (1080, 1920, 100352), (30, 500, 20000)]:
        fh, fw = fit_to_pixel_budget(h, w, budget)
        assert fh % 28 == 0 and fw % 28 == 0 and fh * fw <= max(budget, 28 * 28)
        assert abs(fw / fh - w / h) / (w / h) < 0.35
    assert fit_to_pixel_budget(56, 56, 100 * 56 * 56) == (56, 56)  # no upscaling
    with pytest.raises(ValueError):
        fit_to_pixel_budget(56, 56, 100)


def test_short_videos_yield_an_even_frame_count():
    assert len(uniform_frame_indices(7, 64)) == 6
    assert uniform_frame_indices(1, 8) == [0, 0]
    data = encode_mp4(_ramp_video(num_frames=5, height=56, width=56), fps=2.0)
    assert decode_video(data, 16, 56 * 56).frames.shape[0] == 4


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_videos_raise_a_clear_error(damage):
    data = encode_mp4(_ramp_video(), fps=4.0)
    broken = {"truncated": data[: len(data) // 2], "garbage": b"\x00\x01not a video" * 10, "empty": b""}[
        damage
    ]
    with pytest.raises(VideoDecodeError):
        decode_video(broken, num_frames=8, max_pixels=56 * 56)
