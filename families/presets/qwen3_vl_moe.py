"""Qwen3-VL-MoE: Qwen3-VL's vision tower, prompt layout and processor; a sparse-MoE language model.

Every decoder layer's MLP is a routed mixture of experts (``decoder_sparse_step`` 1, no
dense-only layers, as in ``Qwen/Qwen3-VL-30B-A3B-Instruct``, which has 128 experts of width
768 with 8 active per token). The presets scale that down to 8 experts of a quarter of the
preset's dense MLP width, 2 active per token: per token the active MLP is half the dense one,
the stored expert weights twice it.

Checkpoint layout: transformers 5.19 holds each layer's experts fused as ``gate_up_proj``
(experts, 2 x width, hidden) and ``down_proj`` (experts, hidden, width), while the released
checkpoints store them transposed ((experts, hidden, 2 x width), (experts, width, hidden)).
Its loader accepts both (it transposes when the shape differs), but its ``save_pretrained``
writes the in-memory layout (the reverse ``Transpose(check_dims=True)`` compares the tensor with
the model's own parameter, which always matches), and vLLM 0.32 reads only the released one
(``is_fused_checkpoint_transposed``: "The size of tensor a (96) must match the size of tensor b
(128)" while loading ``down_proj``). Every writer of a model directory (this build, the export
after training) writes the released layout: :meth:`families.ModelFamily.released_state_dict`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from families.presets import qwen3_vl
from families.presets.base import FamilyRecipe, Preset, vision_token_ids

if TYPE_CHECKING:
    from transformers import Qwen3VLMoeConfig


NUM_EXPERTS = 8
EXPERTS_PER_TOKEN = 2
EXPERT_WIDTH_DIVISOR = 4  # each expert's MLP width: the preset's dense intermediate_size / 4


def make_config(preset: Preset, token_ids: dict[str, int]) -> Qwen3VLMoeConfig:
    """The Qwen3-VL-MoE config of ``preset``, with the special-token ids of our tokenizer."""
    from transformers import Qwen3VLMoeConfig

    text_config = {
        **qwen3_vl.text_config(preset, token_ids),
        "num_experts": NUM_EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "moe_intermediate_size": preset.intermediate_size // EXPERT_WIDTH_DIVISOR,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        # transformers' Qwen3-VL-MoE router always renormalises the top-k weights; vLLM reads
        # this flag (absent from transformers 5.19's config class, so set here) and fails without it.
        "norm_topk_prob": True,
        # The transformers default is True (as released); untied like the other families, so
        # the output head is its own weight wherever lvrl syncs or exports weights.
        "tie_word_embeddings": False,
    }
    return Qwen3VLMoeConfig(
        text_config=text_config,
        vision_config=qwen3_vl.vision_config(preset),
        **vision_token_ids(token_ids),
        tie_word_embeddings=False,
        dtype="float32",
    )


RECIPE = FamilyRecipe(
    name="qwen3_vl_moe",
    description=f"Qwen3-VL-MoE: Qwen3-VL, {NUM_EXPERTS} routed experts per layer, {EXPERTS_PER_TOKEN} active",
    model_class="Qwen3VLMoeForConditionalGeneration",
    geometry=qwen3_vl.GEOMETRY,
    default_system_turn=False,
    accepted_frames=qwen3_vl.RECIPE.accepted_frames,
    make_config=make_config,
    make_processor=qwen3_vl.make_processor,
)
