"""What vLLM accepts of a run's rollouts, known before anything is loaded.

vLLM 0.32 refuses, request by request, a multimodal item with more embedding tokens than its
encoder cache, and a prompt longer than ``max_model_len``; it refuses to start with a
``max_model_len`` above the model's ``max_position_embeddings``. Its encoder cache holds
``max(max_num_batched_tokens, the processor's largest dummy item)`` tokens, and for the
Qwen-VL families that dummy is 14 frames at the processor's largest frame size: 114,688 tokens
with the released Qwen2.5-VL processor, where 4,096 frames at 128 tokens a frame pair are
262,144. So the longest video a run's data can give (``data.num_frames`` at
``data.max_pixels_per_frame``) decides ``max_num_batched_tokens`` (:func:`batched_tokens_for`),
and a setting that cannot work is named before any weight is loaded (:func:`limit_problems`).

The price of a larger ``max_num_batched_tokens``: vLLM profiles a forward pass of that many
tokens when it starts, and keeps what that pass needed out of its KV cache (the memory
planner counts it, :func:`planner.memory.engine_check`).
"""

from __future__ import annotations

from dataclasses import dataclass

SMALLEST_DEFAULT_BATCHED_TOKENS = 4096
"""vLLM 0.32's smallest default ``max_num_batched_tokens`` for the ``LLM`` class (on CPU; 8,192 on
most GPUs, 16,384 on H100/H200 and larger): a video of at most this many tokens always fits."""
BATCHED_TOKENS_FLOOR = 16384
"""``max_num_batched_tokens`` set for a longer video is at least vLLM's H100 default."""


@dataclass(frozen=True)
class RolloutShape:
    """The largest inputs a run's rollouts give the engine."""

    video_tokens: int
    """Merged visual tokens of the longest video item (a prompt's video; a tool reply's frames
    are items of their own, never longer)."""
    row_tokens: int
    """Tokens of the longest row: the prompt's text, video and timestamps, every reply and every
    turn the model writes."""


class EngineLimitError(ValueError):
    """The engine would refuse the run's rollouts (or refuse to start); the message says what to set."""


def batched_tokens_for(shape: RolloutShape, configured: int | None) -> int | None:
    """The ``max_num_batched_tokens`` to start vLLM with: the configured value, else one that lets
    the longest video through the encoder cache, else None (vLLM's default does).

    >>> batched_tokens_for(RolloutShape(262_144, 263_000), None)
    262144
    >>> batched_tokens_for(RolloutShape(8_192, 9_000), None), batched_tokens_for(RolloutShape(64, 900), None)
    (16384, None)
    """
    if configured is not None:
        return configured
    if shape.video_tokens <= SMALLEST_DEFAULT_BATCHED_TOKENS:
        return None
    return max(BATCHED_TOKENS_FLOOR, shape.video_tokens)


def limit_problems(
    shape: RolloutShape,
    *,
    max_model_len: int,
    batched_tokens: int | None,
    max_position_embeddings: int | None,
    allow_long_max_model_len: bool,
    where: str = "the engine's init_args",
) -> list[str]:
    """What vLLM would refuse of a run of ``shape`` with these engine settings, each with the
    setting that fixes it (``where`` names the engine's section of the config)."""
    problems = []
    if shape.row_tokens > max_model_len:
        problems.append(
            f"the longest row is {shape.row_tokens:,} tokens (video, prompt text, completions) but "
            f"{where}.max_model_len is {max_model_len:,}: vLLM would refuse those prompts; set "
            f"max_model_len: {shape.row_tokens} (or fewer data.num_frames, a smaller "
            "data.max_pixels_per_frame or data.max_prompt_tokens)"
        )
    if batched_tokens is not None and batched_tokens < shape.video_tokens:
        problems.append(
            f"a video of the run has up to {shape.video_tokens:,} tokens but {where}."
            f"max_num_batched_tokens is {batched_tokens:,}: vLLM's encoder cache (sized by it) would "
            f"refuse it; remove the setting (lvrl then derives it) or set it to at least {shape.video_tokens}"
        )
    if (
        max_position_embeddings is not None
        and max_model_len > max_position_embeddings
        and not allow_long_max_model_len
    ):
        problems.append(
            f"{where}.max_model_len {max_model_len:,} is above the model's max_position_embeddings "
            f"{max_position_embeddings:,}, and vLLM refuses to start with it. Under M-RoPE a video's "
            "positions grow with its duration, not its tokens (Qwen2.5-VL: 2 a second), so a longer "
            "row can still stay below that: if your videos' last positions do, set "
            f"{where}.allow_long_max_model_len: true; else shorten the rows"
        )
    return problems
