"""PyAV encoding/decoding, uniform sampling and the pixel budget (datamodules/video.py)."""

import subprocess
import sys

import av
import numpy as np
import pytest

from core.tool_use.requests import FramesRequest, plan_frames
from datamodules import video as video_module
from datamodules.video import (
    VideoDecodeError,
    decode_frames,
    decode_video,
    fit_to_pixel_budget,
    uniform_frame_indices,
)
from datatools.video_encode import encode_mp4, encode_video
from datatools.video_probe import probe_video


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
    # Frame i is grey level 5 i: lossy compression and YUV conversion move a flat frame's mean by
    # ~1 level (not float rounding, so no ulps); 3 levels stay below the 5 between neighbours,
    # so a decode landing one frame off fails.
    np.testing.assert_allclose(grey, np.array(video.frame_indices) * 5, atol=3)
    assert video.sampled_fps == pytest.approx(8 / 10.0)
    assert video.timestamps[1] == pytest.approx(video.frame_indices[1] / 4.0)


def test_a_frame_request_decodes_the_planned_frames_with_their_true_times():
    data = encode_mp4(_ramp_video(), fps=4.0)  # 10 s
    plan = plan_frames(FramesRequest(2.1, 6.0, 1.0), source_fps=4.0, num_frames=40, frames_allowed=8)
    assert plan.frame_indices == (9, 13, 17, 21)  # first frame at or after 2.1 s, every 4th
    video = decode_frames(data, plan.frame_indices, max_pixels=56 * 56)
    assert video.frame_indices == plan.frame_indices and video.frames.shape == (4, 28, 56, 3)
    assert video.timestamps == plan.timestamps == (2.25, 3.25, 4.25, 5.25)
    # Same bar as above: grey 5 i for frame i, a frame off would be 5 levels away.
    np.testing.assert_allclose(
        video.frames.reshape(4, -1).mean(axis=1), np.array([9, 13, 17, 21]) * 5, atol=3
    )
    for bad in ([], [3, 3], [5, 4]):
        with pytest.raises(ValueError):
            decode_frames(data, bad, max_pixels=56 * 56)
    with pytest.raises(VideoDecodeError):
        decode_frames(data, [39, 40], max_pixels=56 * 56)


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


@pytest.mark.parametrize("extension", ["mp4", "webm", "mkv"])
def test_every_container_decodes_the_right_frames(extension):
    # webm and mkv carry no frame count: it comes from the duration, and decoding still lands
    # on the frame each index names.
    data = encode_video(_ramp_video(num_frames=40, height=56, width=56), fps=4.0, extension=extension)
    info = probe_video(data)
    assert (info.num_frames, info.fps, info.exact_count) == (40, 4.0, extension == "mp4")
    video = decode_video(data, num_frames=8, max_pixels=56 * 56)
    grey = video.frames.reshape(8, -1).mean(axis=1)
    # Frame i is grey level 5 i: lossy compression and YUV conversion move a flat frame's mean by
    # ~1 level (not float rounding, so no ulps); 3 levels stay below the 5 between neighbours,
    # so a decode landing one frame off fails.
    np.testing.assert_allclose(grey, np.array(video.frame_indices) * 5, atol=3)


@pytest.mark.parametrize("extension", ["mp4", "webm"])
def test_probe_rejects_a_video_cut_short(extension):
    data = encode_video(_ramp_video(num_frames=120, height=56, width=56), fps=4.0, extension=extension)
    with pytest.raises(VideoDecodeError):
        probe_video(data[: len(data) * 2 // 3])


def test_seeking_returns_the_same_frames_as_decoding_everything(monkeypatch):
    # 600 frames with a keyframe every 50: 8 sampled frames are 75 apart, so the decoder seeks.
    levels = (np.arange(600) % 50 * 5).astype(np.uint8)
    frames = np.broadcast_to(levels[:, None, None, None], (600, 56, 56, 3)).copy()
    for i in range(600):
        frames[i, :8, : 4 + i // 50 * 4] = 255  # which 50-frame block: the bar's length
    data = encode_video(frames, fps=25.0, codec="mpeg4")  # intra period 12 by default
    seeks = []
    original_seek = av.container.InputContainer.seek
    monkeypatch.setattr(
        av.container.InputContainer,
        "seek",
        lambda self, *a, **k: seeks.append(a) or original_seek(self, *a, **k),
    )
    sought = decode_video(data, num_frames=8, max_pixels=56 * 56)
    assert len(seeks) >= 4
    monkeypatch.setattr(video_module, "_SEEK_MIN_GAP_FRAMES", 10**9)
    seeks.clear()
    walked = decode_video(data, num_frames=8, max_pixels=56 * 56)
    assert not seeks
    assert sought.frame_indices == walked.frame_indices
    np.testing.assert_array_equal(sought.frames, walked.frames)
    np.testing.assert_allclose(
        sought.frames[:, 20:, 20:].reshape(8, -1).mean(axis=1),
        np.array(sought.frame_indices) % 50 * 5,
        atol=4,  # codec error on the flat corner (~1-2 levels), below the 5 levels between frames
    )


def test_sample_fps_picks_frames_per_second_up_to_the_cap():
    data = encode_mp4(_ramp_video(num_frames=40, height=56, width=56), fps=4.0)  # 10 s
    assert decode_video(data, 64, 56 * 56, sample_fps=1.0).frames.shape[0] == 10
    assert decode_video(data, 6, 56 * 56, sample_fps=1.0).frames.shape[0] == 6
    assert decode_video(data, 64, 56 * 56, sample_fps=0.01).frames.shape[0] == 2


# Peak RSS from /proc (VmHWM, kB): unlike getrusage's ru_maxrss, which a child inherits from
# its parent across exec, it belongs to this process alone.
_PEAK_RSS = """
import re, sys
from datamodules.video import decode_video
def peak_kib():
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
before = peak_kib()
video = decode_video(sys.argv[1], int(sys.argv[2]), 56 * 56)
assert video.frames.shape[0] == int(sys.argv[2]), video.frames.shape
print((peak_kib() - before) / 1024)
"""


def test_an_hour_long_video_decodes_in_bounded_memory(tmp_path):
    # One hour at 1 fps, 256x256: keeping every decoded frame would take 3600 x 192 KiB = 675 MiB;
    # the sampled frames, resized while decoding, take 1024 x 9.2 KiB = 9 MiB.
    count, size = 3600, 256
    frames = np.zeros((count, size, size, 3), dtype=np.uint8)
    frames[:] = (np.arange(count) % 200).astype(np.uint8)[:, None, None, None]
    for i in range(count):
        frames[i, 100:140, (i * 3) % 200 : (i * 3) % 200 + 40] = 255
    path = tmp_path / "hour.mp4"
    path.write_bytes(encode_video(frames, fps=1.0))
    del frames
    for sampled in (64, 1024):
        done = subprocess.run(
            [sys.executable, "-c", _PEAK_RSS, str(path), str(sampled)],
            capture_output=True,
            text=True,
            check=True,
        )
        growth_mib = float(done.stdout.strip().splitlines()[-1])
        assert growth_mib < 120, f"decoding {sampled} frames grew the peak RSS by {growth_mib:.0f} MiB"
