"""Tool-use episodes: positions that follow the frames' true times, the loss mask, and scoring
rows with tool video segments equal to the model's own forward from pixels."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.episode_helpers import video_prompt
from helpers.tolerances import FORWARD_ULPS, GRADIENT_ULPS, assert_float32_close

from core.layout import PositionRule, PromptLayout
from core.tool_use.episode import Episode, ToolReply, episode_scoring_batch
from core.video import VideoEmbedding
from models.logprobs import completion_logprobs
from models.vision import encode_row_segments, encode_videos

VIDEO = 9  # placeholder id of the hand-made layouts
RULE = PositionRule(spatial_merge_size=2, tokens_per_second=2.0)


def hand_made_episode() -> Episode:
    # Prompt: 2 text tokens, a video of 2 temporal patches of 2x2 merged tokens, 1 text token.
    # One patch spans 2 s, 2 tokens per second: its temporal positions step by 4.
    prompt = PromptLayout.build([1, 2] + [VIDEO] * 8 + [3], VIDEO, RULE, torch.tensor([2, 4, 4]), 2.0)
    episode = Episode(prompt)
    episode.add_turn([10, 11, 12], [-0.1, -0.2, -0.3], "stop")
    # The tool's segment: 4 frames 0.75 s apart (2 patches of 1.5 s), between 2 and 1 text tokens.
    segment = VideoEmbedding(torch.zeros(8, 4), torch.tensor([2, 4, 4]), 2 * 0.75)
    reply = ToolReply([20, 21] + [VIDEO] * 8 + [22], [False, False] + [True] * 8 + [False], segment)
    episode.add_reply(reply)
    episode.add_turn([13, 14], [-0.4, -0.5], "stop")
    return episode


def test_a_segment_is_positioned_by_its_frames_true_spacing() -> None:
    episode = hand_made_episode()
    positions = episode.positions(RULE)
    assert positions.shape == (3, 11 + 16)
    # The prompt as its own layout placed it: text 0, 1; video t in {0, 4} (2 s x 2 per second),
    # h, w in {0, 1} from 2; text after at one past the largest, 7.
    assert torch.equal(positions[:, :11], episode.prompt.positions)
    assert positions[0, 2:10].tolist() == [2, 2, 2, 2, 6, 6, 6, 6] and positions[0, 10] == 7
    # Turn 1: 8, 9, 10; the reply's text 11, 12; its video starts at 13 and its second patch,
    # 1.5 s later, at 13 + 1.5 x 2 = 16; height/width from 13; the text after at 17, turn 2 at 18.
    assert positions[:, 11:16].tolist() == [[8, 9, 10, 11, 12]] * 3
    segment = positions[:, 16:24]
    assert segment[0].tolist() == [13, 13, 13, 13, 16, 16, 16, 16]
    assert segment[1].tolist() == [13, 13, 14, 14] * 2 and segment[2].tolist() == [13, 14] * 4
    assert positions[:, 24:].tolist() == [[17, 18, 19]] * 3


class OnAnotherDevice(torch.Tensor):
    """A tensor as if on an accelerator, for a machine without one: mixing it with CPU tensors
    fails as CUDA does, and ``.cpu()`` returns it as a plain CPU tensor."""

    @classmethod
    def __torch_function__(
        cls, func: Callable[..., Any], types: tuple, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.Tensor.cpu:
                return func(*args, **(kwargs or {})).as_subclass(torch.Tensor)
            if func is torch.Tensor.reshape:  # stays where it is
                return func(*args, **(kwargs or {})).as_subclass(cls)
            if func is torch.Tensor.__repr__:
                return func(*args, **(kwargs or {}))
        raise RuntimeError(f"Expected all tensors to be on the same device ({func.__name__})")


def test_positions_are_computed_on_the_cpu_whatever_device_the_prompts_grid_is_on() -> None:
    """The prompt's grid comes with its batch (on the GPU in training), a reply's from the
    processor (on the CPU): positions stack both, so they are taken to the CPU first (this failed
    on CUDA with 'Expected all tensors to be on the same device')."""
    expected = hand_made_episode().positions(RULE)
    episode = hand_made_episode()
    episode.prompt.video_grid_thw = episode.prompt.video_grid_thw.as_subclass(OnAnotherDevice)
    with pytest.raises(RuntimeError, match="same device"):
        torch.stack([episode.prompt.video_grid_thw, torch.tensor([2, 4, 4])])
    positions = episode.positions(RULE)
    assert type(positions) is torch.Tensor and torch.equal(positions, expected)


def test_the_episode_keeps_what_was_sampled_and_the_engines_form() -> None:
    episode = hand_made_episode()
    assert episode.sampled_ids == [10, 11, 12, 13, 14] and episode.turns == 2
    assert episode.sampled == [True] * 3 + [False] * 11 + [True] * 2
    # The engine is given each video as one placeholder, and never re-tokenised text.
    assert episode.engine_prompt() == [1, 2, VIDEO, 3, 10, 11, 12, 20, 21, VIDEO, 22, 13, 14]
    batch = episode_scoring_batch([episode], [0], RULE, pad_token_id=0, length_multiple=4)
    assert batch.input_ids.shape == (1, 28) and batch.completion_lengths() == [16]
    assert batch.completion_mask[0].tolist() == episode.sampled
    assert batch.video_mask[0, :27].tolist() == episode.prompt.video_slots.tolist() + episode.video_slots
    with pytest.raises(ValueError, match="placeholders exactly when"):
        ToolReply([20, VIDEO], [False, True], None)


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def real_episodes(request: pytest.FixtureRequest, family_model_dir, synth_dir: Path) -> dict:
    """Two episodes of one real video prompt, each with a different served segment of 4 frames
    (every 2nd source frame: 1 s apart at 2 fps), then a last turn; for Qwen2.5-VL (time in the
    positions) and Qwen3-VL (time as text, DeepStack features at every visual token)."""
    prompt = video_prompt(family_model_dir(request.param), synth_dir)
    episodes, pixels, grids = [], [prompt.pixel_values_videos], [prompt.video_grid_thw]
    for first in (2, 10):
        episode, segment_pixels, grid = prompt.served_episode(tuple(range(first, first + 8, 2)))
        final = prompt.ids("<think>seen</think><answer>B</answer><|im_end|>")
        episode.add_turn(final, [0.0] * len(final), "stop")
        episodes.append(episode)
        pixels.append(segment_pixels)
        grids.append(grid)
    return {
        "model": prompt.model,
        "family": prompt.family,
        "pad": prompt.processor.tokenizer.pad_token_id,
        "episodes": episodes,
        "prompt_video": prompt.video_embeds,
        "pixels": pixels,
        "grids": grids,
    }


@torch.no_grad()
def test_episode_rows_score_as_the_models_own_forward_from_pixels(real_episodes: dict) -> None:
    model, family, episodes = real_episodes["model"], real_episodes["family"], real_episodes["episodes"]
    assert all(len(e.segments) == 1 for e in episodes)
    # Frames 1 s apart, 2 per temporal patch: 2 s per patch.
    assert [e.segments[0].second_per_grid for e in episodes] == [2.0, 2.0]
    deepstack = family.split_encoding(episodes[0].segments[0].embeds)[1]
    assert (deepstack is not None) == (family.name == "qwen3_vl")
    scoring = episode_scoring_batch(episodes, [0, 0], family.position_rule, pad_token_id=real_episodes["pad"])
    segments = [[e.segments[0].embeds] for e in episodes]
    expected = torch.zeros(scoring.completion_mask.shape)
    prompt_pixels, prompt_grid = real_episodes["pixels"][0], real_episodes["grids"][0]
    for row in range(2):
        length = int(scoring.attention_mask[row].sum())
        logits = model(
            input_ids=scoring.input_ids[row : row + 1, :length],
            pixel_values_videos=torch.cat([prompt_pixels, real_episodes["pixels"][row + 1]]),
            video_grid_thw=torch.cat([prompt_grid, real_episodes["grids"][row + 1]]),
            position_ids=scoring.position_ids[:, row : row + 1, :length],
        ).logits[0]
        start = scoring.prompt_lengths[row]
        targets = scoring.input_ids[row, start:length]
        log_probs = torch.log_softmax(logits[start - 1 : length - 1].float(), dim=-1)
        expected[row, : length - start] = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    expected *= scoring.completion_mask
    for share in (False, True):
        ours = completion_logprobs(
            model, scoring, [real_episodes["prompt_video"]], share_prompts=share, segment_embeds=segments
        )
        assert_float32_close(
            ours, expected, ulps=FORWARD_ULPS, reason=f"episode rows (shared prompt: {share}) vs own forward"
        )
        assert torch.equal(
            ours[scoring.completion_mask == 0], torch.zeros(int((scoring.completion_mask == 0).sum()))
        )
    # The segments matter: swapping them between the rows moves the second turn's scores.
    swapped = completion_logprobs(
        model, scoring, [real_episodes["prompt_video"]], segment_embeds=segments[::-1]
    )
    last_turn = scoring.completion_mask.bool() & (torch.arange(scoring.completion_mask.shape[1]) > 30)
    assert (swapped - expected)[last_turn].abs().max() > 1e-3


def test_no_logits_are_computed_for_the_tokens_a_tool_wrote(real_episodes: dict) -> None:
    """The LM head runs only at positions that predict a sampled token: a served segment's
    video tokens (thousands at real frame sizes) would otherwise be the pass's largest logits."""
    model, family, episodes = real_episodes["model"], real_episodes["family"], real_episodes["episodes"]
    scoring = episode_scoring_batch(episodes, [0, 0], family.position_rule, pad_token_id=real_episodes["pad"])
    segments = [[e.segments[0].embeds] for e in episodes]
    mask = scoring.completion_mask.bool()
    # Each row's sampled tokens, as positions of the whole row (what predicts them: one before).
    predicting = [
        {start - 1 + int(j) for j in torch.nonzero(mask[row]).squeeze(1)}
        for row, start in enumerate(scoring.prompt_lengths)
    ]
    widths: list[int] = []
    hook = model.lm_head.register_forward_hook(lambda _m, args, _out: widths.append(args[0].shape[-2]))
    try:
        for share in (False, True):
            widths.clear()
            completion_logprobs(
                model, scoring, [real_episodes["prompt_video"]], share_prompts=share, segment_embeds=segments
            )
            if share:  # the prompt pass's last position predicts each row's first token
                assert widths[0] == 1 and widths[1] == len(set().union(*predicting)) - 1, widths
            else:
                assert widths == [len(set().union(*predicting))]
    finally:
        hook.remove()
    # Not the whole completion width: at least a reply's 8 video tokens were skipped.
    assert len(set().union(*predicting)) <= mask.shape[1] - 8


def test_a_trainable_vision_tower_learns_from_the_segments_as_from_pixels(real_episodes: dict) -> None:
    """With a trainable tower the policy pass encodes each segment again, with grad
    (:func:`models.vision.encode_row_segments`): the tower's gradients equal those of the
    model's own forward from every video's pixels."""
    model, family, episodes = real_episodes["model"], real_episodes["family"], real_episodes["episodes"]
    scoring = episode_scoring_batch(episodes, [0, 0], family.position_rule, pad_token_id=real_episodes["pad"])
    pixels, grids = real_episodes["pixels"], real_episodes["grids"]
    weights = torch.randn(scoring.completion_mask.shape, generator=torch.Generator().manual_seed(3))
    tower = [(name, p) for name, p in model.named_parameters() if name.startswith("model.visual.")]

    def tower_gradients(loss: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad()
        loss.backward()
        return {name: p.grad.clone() for name, p in tower}

    expected = torch.zeros(scoring.completion_mask.shape)
    for row in range(2):
        length = int(scoring.attention_mask[row].sum())
        logits = model(
            input_ids=scoring.input_ids[row : row + 1, :length],
            pixel_values_videos=torch.cat([pixels[0], pixels[row + 1]]),
            video_grid_thw=torch.cat([grids[0], grids[row + 1]]),
            position_ids=scoring.position_ids[:, row : row + 1, :length],
        ).logits[0]
        start = scoring.prompt_lengths[row]
        log_probs = torch.log_softmax(logits[start - 1 : length - 1].float(), dim=-1)
        targets = scoring.input_ids[row, start:length].unsqueeze(-1)
        expected[row, : length - start] = log_probs.gather(-1, targets).squeeze(-1)
    want = tower_gradients((expected * scoring.completion_mask * weights).sum())

    segments = encode_row_segments(model, [ep.segment_inputs() for ep in episodes])
    (prompt_video,) = encode_videos(model, pixels[0], grids[0])
    ours = completion_logprobs(model, scoring, [prompt_video], segment_embeds=segments)
    got = tower_gradients((ours * weights).sum())
    assert any(g.abs().max() > 0 for g in want.values())
    for name, gradient in want.items():
        assert_float32_close(got[name], gradient, ulps=GRADIENT_ULPS, reason=f"{name}: re-encoded segments")
    # Rows served the same frames share one encoding.
    shared = episodes[0].segment_inputs()
    first, second = encode_row_segments(model, [shared, shared])
    assert first[0] is second[0]
