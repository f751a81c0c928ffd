"""Frames, frame sizes and temporal positions as Qwen's own preprocessing gives them.

For encoded videos of several lengths, rates and aspect ratios and for several settings (fps or
nframes, frame bounds, pixel bounds, a per-video pixel total, both patch sizes), lvrl's decoding
with ``qwen_video`` must give the frame indices, the resized size and the sampled rate that the
``qwen-vl-utils`` package's ``fetch_video`` gives for the same file and settings.

``fetch_video`` reads a file with torchvision's ``read_video``, decord or torchcodec; none of them
works here (torchvision 0.28 has no ``read_video``; decord and torchcodec are not installed), so
the test hands its torchvision path a ``read_video`` that decodes every frame with PyAV: the
package's own code then counts the frames, picks the indices and resizes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch

from datamodules.qwen_video import QwenVideoSettings
from datamodules.video import decode_video
from datatools.video_encode import encode_mp4

# (frames, fps, height, width): 3 s at 30 fps, 5 s of 16:9 at 25, 8.3 s portrait at 24, 6.1 s at 10.
VIDEOS = ((90, 30.0, 48, 64), (125, 25.0, 54, 96), (200, 24.0, 120, 40), (61, 10.0, 32, 32))
SETTINGS: tuple[dict[str, Any], ...] = (
    {},  # Qwen's defaults: 2 fps, 4 .. 768 frames, 128 .. 768 merged patches a frame
    {"fps": 1.0},
    {"nframes": 10},
    {"fps": 6.0, "min_frames": 6, "max_frames": 24},
    {"min_pixels": 4 * 28 * 28, "max_pixels": 16 * 28 * 28},
    {"fps": 4.0, "min_pixels": 28 * 28, "total_pixels": 50_000},  # the total caps some frames
)
GREY_PERIOD = 50  # frame i is grey level 5 (i mod 50): neighbours differ by 5 levels


def ramp(frames: int, height: int, width: int) -> np.ndarray:
    levels = (np.arange(frames) % GREY_PERIOD * 5).astype(np.uint8)
    return np.broadcast_to(levels[:, None, None, None], (frames, height, width, 3)).copy()


def pyav_read_video(path: str, start_pts: float = 0.0, end_pts: Any = None, pts_unit: str = "sec", **_: Any):
    """torchvision's ``read_video`` contract (TCHW uint8 frames, audio, info) from PyAV, every frame."""
    assert start_pts == 0.0 and end_pts is None and pts_unit == "sec"
    with av.open(path) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        fps = float(stream.average_rate)
    video = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()
    return video, torch.empty(0), {"video_fps": fps}


@pytest.fixture(scope="module")
def video_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("qwen-videos")
    paths = []
    for frames, fps, height, width in VIDEOS:
        path = folder / f"{frames}f-{fps:g}fps-{width}x{height}.mp4"
        path.write_bytes(encode_mp4(ramp(frames, height, width), fps))
        paths.append(path)
    return paths


@pytest.fixture()
def qwen_fetch_video(monkeypatch: pytest.MonkeyPatch):
    import torchvision.io
    from qwen_vl_utils import vision_process

    monkeypatch.setattr(torchvision.io, "read_video", pyav_read_video, raising=False)
    monkeypatch.setattr(vision_process, "get_video_reader_backend", lambda: "torchvision")
    return vision_process.fetch_video


@pytest.mark.parametrize("factor", [28, 32])
@pytest.mark.parametrize(
    "settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "defaults"
)
def test_frames_sizes_and_rate_equal_qwen_vl_utils(
    settings: dict[str, Any], factor: int, video_files: list[Path], qwen_fetch_video
) -> None:
    for path in video_files:
        (video, metadata), sample_fps = qwen_fetch_video(
            {"video": str(path), **settings},
            image_patch_size=factor // 2,
            return_video_sample_fps=True,
            return_video_metadata=True,
        )
        ours = decode_video(path.read_bytes(), 768, 10**7, factor=factor, qwen=QwenVideoSettings(**settings))
        where = f"{path.name} {settings} factor {factor}"
        assert list(ours.frame_indices) == metadata["frames_indices"].tolist(), where
        assert ours.frames.shape[1:3] == tuple(video.shape[2:]), where
        assert ours.total_num_frames == metadata["total_num_frames"] and ours.fps == metadata["fps"], where
        # The temporal positions: the rate the processor derives from lvrl's metadata (frames /
        # total x fps) is the package's sample_fps: the same three numbers in the same order.
        assert len(ours.frame_indices) / ours.total_num_frames * ours.fps == sample_fps, where
        # lvrl decoded the frames it names (grey level 5 i mod 250; lossy by ~1 level).
        grey = ours.frames.reshape(len(ours.frames), -1).mean(axis=1)
        expected = np.array(ours.frame_indices) % GREY_PERIOD * 5
        np.testing.assert_allclose(grey, expected, atol=3, err_msg=where)


def test_the_bounds_refuse_what_qwen_would_sample_beyond_them(video_files: list[Path]) -> None:
    from datamodules.video import VideoDecodeError

    with pytest.raises(VideoDecodeError, match="beyond num_frames 4"):
        decode_video(video_files[0].read_bytes(), 4, 10**7, qwen=QwenVideoSettings())  # 3 s at 2 fps: 6
    with pytest.raises(VideoDecodeError, match="Qwen's video sampling refuses it"):
        decode_video(video_files[3].read_bytes(), 768, 10**7, qwen=QwenVideoSettings(nframes=100))
    # A pixel total so small that Qwen's resize floors the portrait video's width to 0 pixels.
    tiny_total = QwenVideoSettings(fps=4.0, min_pixels=28 * 28, total_pixels=20_000)
    with pytest.raises(VideoDecodeError, match="a side of 0 pixels"):
        decode_video(video_files[2].read_bytes(), 768, 10**7, qwen=tiny_total)
    with pytest.raises(ValueError, match="fps or nframes"):
        QwenVideoSettings(fps=1.0, nframes=8)


def test_the_datamodule_samples_as_qwen_within_its_bounds(synth_dir: Path, tiny_model_dir: Path) -> None:
    from datamodules.longvideo_reason import LongVideoReasonDataModule

    def datamodule(**overrides: Any) -> LongVideoReasonDataModule:
        settings = {"nframes": 8, "min_pixels": 28 * 28, "max_pixels": 56 * 56}
        arguments = {"num_frames": 8, "max_pixels_per_frame": 56 * 56, "qwen_video": settings, **overrides}
        return LongVideoReasonDataModule(
            val_shards=str(synth_dir / "val-*.tar"),
            processor_path=str(tiny_model_dir),
            batch_size=4,
            num_workers=0,
            **arguments,
        )

    data = datamodule()
    data.setup("validate")
    batch = next(iter(data.val_dataloader()))
    # The synthetic videos: 20 frames of 56 x 56 at 2 fps; nframes 8 at 0.8 frames a second, so
    # a temporal patch (2 frames) spans 2.5 s; min_pixels 784 keeps 56 x 56 (4 merged patches).
    assert [m["num_frames"] for m in batch["meta"]] == [8] * 4
    assert batch["second_per_grid_ts"].tolist() == [2.5] * 4
    assert batch["video_grid_thw"].tolist() == [[4, 4, 4]] * 4
    # Qwen's defaults ask for up to 768 frames of 602,112 pixels: beyond this run's bounds.
    too_many = datamodule(qwen_video={})
    with pytest.raises(ValueError, match="up to 768 frames of 602,112 pixels"):
        too_many.setup("validate")
    with pytest.raises(ValueError, match=r"leave data\.sample_fps"):
        datamodule(sample_fps=1.0)
    with pytest.raises(TypeError):
        datamodule(qwen_video={"frames": 8})  # not a key of qwen-vl-utils
