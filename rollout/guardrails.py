"""Guardrails on what a rollout may contain: tokens the engine never samples, completions rejected.

Two layers, because they fail differently:

- **Never sampled**: the vision placeholders and the markers around them
  (:meth:`families.base.ModelFamily.vision_token_ids`), and the embedding's padding rows
  (ids no token of the tokenizer has). Only the processor writes the placeholders; a sampled
  ``<|video_pad|>`` makes a later pass read the completion as a video slot, and a Qwen3-VL run
  in another framework died at step 44 of it (verl #5817); a padding id decodes to nothing.
  Both engines remove them from the sampling distribution (vLLM: ``allowed_token_ids``, the
  transformers engine: a mask on its logits). The log-probs they report stay the model's own
  (vLLM reports ``raw_logprobs``, taken before any logits processor), so the trainer's ratio is
  unchanged.
- **Rejected after sampling**: any other special token the chat template does not let an
  assistant turn hold (``<|im_start|>``, the box and quad markers, ...: every special token but
  the end-of-turn ones). Such a completion is decoded without it (``skip_special_tokens``), so
  the reward would score text that is not what the model wrote: it is left out of the loss,
  counted (``rollout/rejected_special_tokens``) and never placed into a video slot (completion
  tokens never are: :class:`core.layout.ScoringBatch` marks video slots in the prompt only).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from families import family_of
from rollout.base import Completion

STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
"""The tokens that end an assistant turn: the only special tokens a completion may hold (last)."""


def banned_token_ids(model_config: Any, tokenizer: Any) -> list[int]:
    """The ids no engine may sample for this model: its family's vision tokens, and the rows of its
    embedding with no token behind them (``len(tokenizer)`` up to the vocabulary size: the padding
    a checkpoint's embedding carries, 271 rows in Qwen2.5-VL's). Such an id decodes to nothing, so
    the reward would score text the model did not write."""
    text_config = getattr(model_config, "text_config", model_config)
    padding = range(len(tokenizer), int(text_config.vocab_size))
    return sorted({*family_of(model_config).vision_token_ids(tokenizer), *padding})


def forbidden_completion_ids(tokenizer: Any) -> frozenset[int]:
    """Special tokens an assistant turn must not hold: every special token but the stop tokens."""
    stops = {tokenizer.convert_tokens_to_ids(token) for token in STOP_TOKENS}
    specials = set(tokenizer.all_special_ids)
    specials |= {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    return frozenset(specials - stops)


def holds_forbidden_tokens(completion: Completion, forbidden: Collection[int]) -> bool:
    """Whether the completion holds a forbidden special token (anywhere, the last token too)."""
    return any(token in forbidden for token in completion.token_ids)


def rejected_rows(completions: Sequence[Completion], forbidden: Collection[int]) -> list[bool]:
    """Per completion, whether it is rejected for a forbidden special token."""
    return [holds_forbidden_tokens(c, forbidden) for c in completions]
