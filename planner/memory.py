"""Per-device memory plan of an lvrl run: what each GPU (or CPU process) holds, from arithmetic alone.

Nothing here touches a device or a process group: the plan is computed from the model's
sizes (:class:`Architecture`) and the run's settings (:class:`RunSettings`), so ``lvrl plan``
answers in a second on a laptop, and start-up validation can refuse a config before any
weight is loaded. Every figure is per device (per rank) and in bytes.

What is counted (the lines of :func:`plan_memory`; the formulas are in each function):

- **sharded state** (FSDP2 over the data x sequence world, or within a node for ``hybrid``):
  master parameters, their gradients, AdamW's two moments, the reference model in the compute
  dtype. ``cpu_offload`` (FSDP2's ``CPUOffloadPolicy``) moves parameters, gradients and
  optimizer states to host memory.
- **gathered units**: FSDP2 all-gathers one unit (a decoder block, the embedding, the output
  head) at a time and prefetches the next, in the compute dtype; in backward the unit's full
  gradient exists in the compute dtype and is copied into a reduce-dtype reduce-scatter input,
  which is kept until the next unit reduces.
- **activations** of one micro-batch: with checkpointing, each layer's input plus one layer's
  full working set (recomputed in backward); without, every layer's saved tensors. The
  per-token counts of a decoder layer are exact for transformers' Qwen2.5-VL and Qwen3-VL layers with a
  flash-style attention kernel (checked against autograd's saved tensors in the tests).
  Sequence parallelism divides the tokens of the layers (not the whole-row input embeddings,
  built before the split). Logits exist only at the completion (or target) positions.
- **the vision tower**: frozen, it is replicated (not sharded) in its dtype and runs without
  autograd over this rank's share of the frames (MR-SP stage 1); the embeddings are cached
  for the step. Trainable, it is sharded like the language model and its activations count.
- **the colocated vLLM engine**: it reserves ``gpu_memory_utilization`` of the device,
  whatever it needs; the plan checks that its weights, the activations of the forward pass it
  profiles at start-up (``max_num_batched_tokens`` tokens, raised to the longest video so that
  its encoder cache takes it), its encoder cache and the KV cache of the rollouts fit inside that
  reservation (:class:`EngineCheck`). With sleep mode the engine releases its memory while the
  trainer trains, and from the weight sync to the next rollout holds only its weights. Outside
  its share it holds its own context and what sleep keeps (:data:`VLLM_OUTSIDE_SHARE`).
- **validation** between steps, as the module runs it (:class:`ValidationSettings`): the policy
  gathered whole on every rank, the batch's videos encoded over the sequence-parallel group,
  a question's decoding or the batch's loss forward.
- **framework overhead** on a GPU: CUDA context and workspaces, NCCL's buffers per process
  group, the caching allocator's fragmentation (:data:`CUDA_CONTEXT`, :data:`NCCL_PER_GROUP`,
  :data:`FRAGMENTATION`): stated allowances.

The peak is the largest phase of a step: rollout (vLLM awake, the video encoded), weight sync
(vLLM's weights awake, the new weights streamed to it one parameter at a time or more), two
moments of training: backward through the output head (logits and their gradients alive, every
layer's activations stored) and backward through a decoder block (its recomputed working set
alive), and validation. SFT has the encoding, the two training moments and validation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

CUDA_CONTEXT = 1 * GIB
"""CUDA context and kernels (~0.7 GiB with torch's libraries loaded) and the cuBLAS/flash
workspaces: an allowance, not a measurement of this run."""
NCCL_PER_GROUP = GIB // 2
"""NCCL's buffers per communicator the trainer opens (the world, data-parallel, sequence-parallel
and sequence-exchange groups): reports range over 0.4-1.5 GB a communicator; an allowance."""
VLLM_OUTSIDE_SHARE = 3 * GIB // 2
"""What a colocated vLLM holds outside its ``gpu_memory_utilization`` share: its engine process's
context (in its own process by default on a GPU) and what level-1 sleep keeps on the device
(reported 0.5-3 GB); an allowance."""
FRAGMENTATION = 0.05
"""Share of the trainer's tensors lost to the caching allocator's fragmentation (lower with
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``): a stated allowance, not measured."""
RING_QUERY_CHUNK = 1024
"""Queries scored at a time against a key/value block by ring attention (``parallel.ring``);
its score chunks are the ring's transient memory. Kept equal by a test."""
ENGINE_BATCHED_TOKENS = 16384
"""Tokens per vLLM forward (chunked prefill) whose activations vLLM profiles at start-up: its
default ``max_num_batched_tokens`` on an H100 (a run's longest video can raise it:
:attr:`EngineSettings.batched_tokens`)."""
ENGINE_FIXED_OVERHEAD = 1 * GIB
"""vLLM's CUDA graphs, sampler and workspace buffers, within its reservation: an allowance."""
ENGINE_LINE = "vLLM engine (reserved)"
PIXEL_VALUES_PER_PATCH_BYTES = 4
"""The processor hands pixel values to the tower in float32."""
TOOL_REPLY_TEXT_TOKENS = 128
"""Text tokens of one frames-tool reply besides its video (``core.tool_use.reply``: the turn's markers,
``<tool_response>`` and a line such as ``frames 00:12.0-00:19.0, 8 frames, 1.00 s apart``), at
most: a byte-level BPE tokenizer (Qwen's) writes no more tokens than the text has UTF-8 bytes
(a special token such as ``<|im_start|>`` is one), and the longest served reply has fewer (a
test keeps it so)."""

Phase = Literal[
    "always",
    "rollout",
    "sync",
    "head",
    "layers",
    "end",
    "validation",
    "training",
    "backward",
    "engine",
    "between",
]
"""When a line is held: always; in one phase; ``training``: while backward runs through the head
and the blocks (``head``: through the output head, the logits' gradients alive; ``layers``:
through a decoder block, its working set alive), ``backward``: those and ``end`` (backward done,
the activations gone, the root unit's gradient reducing);
``engine``: whenever vLLM is awake (rollout and sync);
``between``: from a step's weight sync to the next rollout (the sync, a validation), when a
sleeping vLLM has its weights back and its KV cache not yet."""
PHASES = ("rollout", "sync", "head", "layers", "end", "validation")
HELD_IN: dict[str, frozenset[str]] = {
    "training": frozenset({"head", "layers"}),
    "backward": frozenset({"head", "layers", "end"}),
    "engine": frozenset({"rollout", "sync"}),
    "between": frozenset({"sync", "validation"}),
}


@dataclass(frozen=True)
class TextModel:
    """The language model's sizes (a Qwen2 decoder: q/k/v projections with bias, SwiGLU MLP; or,
    with ``qk_norm``, a Qwen3 one)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    qk_norm: bool = False
    """Qwen3: an RMSNorm over each head's queries and keys (``head_dim`` weights each)."""
    qkv_bias: bool = True
    """Biases on the q, k and v projections (Qwen2's; Qwen3's ``attention_bias``, off in the
    released models)."""
    o_bias: bool = False
    """A bias on the output projection (Qwen3's ``attention_bias`` puts one there too)."""

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_parameters(self) -> int:
        """Two RMSNorms, q/k/v (with bias unless ``qkv_bias`` is off), the q/k norms (Qwen3), o
        (bias only with ``o_bias``), gate/up/down (no bias)."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        biases = (q + 2 * kv if self.qkv_bias else 0) + (h if self.o_bias else 0)
        head_norms = 2 * self.head_dim if self.qk_norm else 0
        attention = h * q + 2 * h * kv + biases + head_norms
        return 2 * h + attention + q * h + 3 * h * i

    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    def lora_parameters(self, rank: int, targets: Sequence[str]) -> int:
        """LoRA adapters of rank ``rank`` on the named projections of every decoder layer: ``rank x
        (in + out)`` each (``A``: rank x in, ``B``: out x rank)."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        widths = {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }
        return self.num_layers * sum(rank * sum(widths[t]) for t in targets if t in widths)

    def head_parameters(self) -> int:
        """The output projection (none of its own when tied to the embedding) and the final norm."""
        return (0 if self.tied_embeddings else self.vocab_size * self.hidden_size) + self.hidden_size

    def parameters(self) -> int:
        return (
            self.embedding_parameters() + self.num_layers * self.layer_parameters() + self.head_parameters()
        )

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one token over all layers (what a KV cache stores)."""
        return self.num_layers * 2 * self.kv_dim * dtype_bytes


@dataclass(frozen=True)
class VisionModel:
    """The vision tower's sizes (Qwen2.5-VL's ViT: 3-D patch embedding, blocks with RMSNorms and a
    gated MLP, 2x2 patch merger; the defaults). Qwen3-VL's differs in the fields after
    ``in_channels``: LayerNorms, a plain GELU MLP, a biased patch embedding, learned position
    embeddings, and DeepStack mergers whose features go to the first decoder layers."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    mlp: Literal["gated", "gelu"] = "gated"
    norm: Literal["rms", "layer"] = "rms"
    patch_bias: bool = False
    position_embeddings: int = 0
    """Rows of a learned position table (Qwen3-VL: 2,304, interpolated to the grid)."""
    deepstack_levels: int = 0
    """Blocks whose merged features are added to the first decoder layers' hidden states, each
    through a merger of its own (Qwen3-VL: 3); cached with the video's embedding."""
    text_tokens_per_temporal_patch: int = 0
    """Text the processor writes around each temporal patch (Qwen3-VL: ``<12.5 seconds>`` and the
    vision start/end tokens)."""

    @property
    def mlp_tensors(self) -> int:
        """Intermediate-sized tensors of one MLP forward: gate, up and their product (gated), or
        the first projection and its activation (GELU)."""
        return 3 if self.mlp == "gated" else 2

    @property
    def patch_values(self) -> int:
        """Pixel values in one patch (channels x frames x rows x columns)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def pixels_per_token(self) -> int:
        """Frame pixels behind one merged visual token (28 x 28 for Qwen2.5-VL)."""
        return (self.patch_size * self.spatial_merge_size) ** 2

    def norm_parameters(self, width: int) -> int:
        return width * (1 if self.norm == "rms" else 2)  # a LayerNorm has a bias too

    def block_parameters(self) -> int:
        """Two norms, fused qkv and output projections, the MLP (gate/up/down, or two
        projections): all Linear layers with bias."""
        h, i = self.hidden_size, self.intermediate_size
        mlp = (2 if self.mlp == "gated" else 1) * (h * i + i) + (i * h + h)
        return 2 * self.norm_parameters(h) + (h * 3 * h + 3 * h) + (h * h + h) + mlp

    def merger_parameters(self) -> int:
        """A norm over each patch, then an MLP over the ``merge x merge`` concatenated patches
        (with biases); each DeepStack merger normalises the concatenation instead."""
        h, merged = self.hidden_size, self.hidden_size * self.spatial_merge_size**2
        mlp = (merged * merged + merged) + (merged * self.out_hidden_size + self.out_hidden_size)
        deepstack = self.deepstack_levels * (self.norm_parameters(merged) + mlp)
        return self.norm_parameters(h) + mlp + deepstack

    def parameters(self) -> int:
        patch_embed = (self.patch_values + (1 if self.patch_bias else 0)) * self.hidden_size  # Conv3d
        positions = self.position_embeddings * self.hidden_size
        return patch_embed + positions + self.depth * self.block_parameters() + self.merger_parameters()


@dataclass(frozen=True)
class Architecture:
    """A vision-language model's sizes: all the planner knows of the model."""

    name: str
    text: TextModel
    vision: VisionModel

    def parameters(self) -> int:
        return self.text.parameters() + self.vision.parameters()


@dataclass(frozen=True)
class EngineSettings:
    """The colocated rollout engine (vLLM) as the plan sees it."""

    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.4
    max_model_len: int | None = None
    """None: the run's longest row (what the engine derives, ``rollout.engine_limits``)."""
    max_num_seqs: int = 64
    batched_tokens: int | None = None
    """``max_num_batched_tokens`` as the engine starts with it (``planner.run_config`` resolves it
    from the data as the engine does); vLLM profiles a forward pass of that many tokens at start.
    None: :data:`ENGINE_BATCHED_TOKENS`, vLLM's default on an H100."""
    sleep_mode: bool = False
    """Level-1 sleep between rollouts: weights to host memory, KV cache released."""
    prefix_caching: bool = True
    """The G samples of a prompt share its KV blocks (vLLM's automatic prefix caching, on by
    default): the prompt is stored once. Without it each sample stores its own copy."""


@dataclass(frozen=True)
class ValidationSettings:
    """The validation a training run makes (``trainer.val_check_interval`` with validation batches), as
    :class:`models.vlm_module.VLMModule` runs it: the policy gathered whole on every rank (ranks may
    hold different numbers of batches, so no collective may run inside), each batch's videos
    encoded over the sequence-parallel group, every question decoded by the transformers engine
    (its greedy answer, then ``samples`` sampled ones: that many copies of the prompt prefilled
    together), and the teacher-forced loss of the batch over its targets."""

    batch_size: int
    num_frames: int
    """The most frames a validation video has (``data.num_frames``, or the largest of a sweep)."""
    samples: int = 0
    max_new_tokens: int = 256
    target_tokens: int = 4096
    """Targets of the loss forward (``data.max_target_tokens``)."""
    sanity_check: bool = False
    """Lightning's sanity check validates before the first step (``trainer.num_sanity_val_steps``,
    2 by default), with a colocated vLLM just started and wholly awake."""


@dataclass(frozen=True)
class RunSettings:
    """Everything of a run's config that decides its memory (read by ``planner.run_config``)."""

    kind: Literal["grpo", "sft"]
    world_size: int
    devices_per_node: int
    num_frames: int
    max_pixels_per_frame: int
    text_tokens: int
    """Prompt tokens besides the video's (the data's ``max_prompt_tokens`` bound)."""
    completion_tokens: int
    """GRPO: the rollouts' ``max_new_tokens``; SFT: the target's bound (``max_target_tokens``)."""
    sequence_parallel_size: int = 1
    sequence_parallel_attention: Literal["ulysses", "ring"] = "ulysses"
    sharding: Literal["full", "hybrid", "replicated"] = "full"
    master_dtype: str = "float32"
    param_dtype: str = "bfloat16"
    reduce_dtype: str = "float32"
    cpu_offload: bool = False
    freeze_vision: bool = True
    frozen_vision_dtype: str | None = None
    """dtype of a frozen (replicated) tower; None: the master dtype, as the model was loaded."""
    gradient_checkpointing: bool = True
    reference: Literal["none", "sharded", "cpu"] = "none"
    micro_batch_rows: int | None = None
    """Rows per forward/backward (GRPO); None: the whole rollout batch at once."""
    batch_size: int = 1
    """Prompts (GRPO) or samples (SFT) per data-parallel rank and step."""
    num_generations: int = 8
    shared_prompt_pass: bool = False
    """GRPO scores each prompt once per micro-batch and its completions against its cached keys
    and values (``share_prompt_prefix`` without sequence parallelism); else rows go whole."""
    engine: EngineSettings | None = None
    policy_generates: bool = False
    """GRPO samples with the policy itself (the transformers engine, no vLLM): under sharding
    every FSDP unit is gathered for it (``parallel.sharding.gathered``: a whole copy in the
    compute dtype), and its generation holds a KV cache."""
    lora_rank: int | None = None
    """LoRA adapters of this rank train instead of the model (None: full fine-tuning): the base is
    held frozen, gradients and optimizer states are the adapters' only, and the reference is
    the policy with its adapters disabled (no copy)."""
    lora_targets: tuple[str, ...] = ()
    """The decoder projections the adapters sit on (vision-tower adapters are not counted)."""
    tool_calls: int = 0
    """GRPO with frames on request: the most requests an episode may make (``tool_use.max_calls``);
    its row then holds up to ``tool_calls + 1`` model turns of ``completion_tokens`` each and a
    reply per request (0: single-turn rollouts)."""
    tool_frames: int = 0
    """The most frames the replies of one episode hold (``tool_use.frames_per_episode``), at
    ``max_pixels_per_frame`` each."""
    validation: ValidationSettings | None = None
    """The validation between training steps; None: the run validates nothing."""
    vision_patches_per_pass: int | None = None
    """The tower encodes at most this many patches at once (the module's setting); None: all."""

    @property
    def shard_size(self) -> int:
        """Ranks one parameter is split over."""
        return {"full": self.world_size, "hybrid": self.devices_per_node, "replicated": 1}[self.sharding]


@dataclass(frozen=True)
class Device:
    """What one rank runs on: a CUDA GPU (with vLLM and framework overhead) or a CPU process."""

    kind: Literal["cuda", "cpu"]
    memory: int


@dataclass(frozen=True)
class Tokens:
    """Token counts behind the activation lines."""

    video: int
    prompt: int
    completion: int
    """Tokens the model writes in a row: every turn of a tool-use episode."""
    rows: int
    """Rows in one forward/backward (a micro-batch)."""
    layer_tokens: int
    """Tokens through the decoder layers on one rank in one micro-batch."""
    logit_positions: int
    """Positions whose full-vocabulary logits one rank computes in one micro-batch."""
    patches: int
    """Vision patches this rank encodes for one step."""
    replies: int = 0
    """Tokens of a row's tool replies (their frames, the frames' timestamps, their text)."""
    served_video: int = 0
    """Merged visual tokens of the frames one episode is served, at most."""

    @property
    def row(self) -> int:
        """Tokens of one whole row: prompt, replies and the model's turns."""
        return self.prompt + self.replies + self.completion


@dataclass(frozen=True)
class Line:
    """One row of the plan: bytes on each device, when they are held, and how they were counted."""

    name: str
    bytes: float
    phase: Phase
    note: str

    def held_in(self, phase: str) -> bool:
        """Whether the line's bytes are on the device during ``phase``."""
        return self.phase in ("always", phase) or phase in HELD_IN.get(self.phase, ())


@dataclass(frozen=True)
class EngineCheck:
    """Whether the rollouts' KV cache fits in what vLLM reserves."""

    reserved: float
    weights: float
    activations: float
    encoder_cache: float
    kv_needed: float
    kv_tokens: int
    max_model_len_needed: int

    @property
    def kv_available(self) -> float:
        return self.reserved - self.weights - self.activations - self.encoder_cache

    @property
    def fits(self) -> bool:
        return self.kv_needed <= self.kv_available

    @property
    def utilization_needed(self) -> float:
        """The smallest share of the device that holds the engine (weights, activations, KV)."""
        return self.weights + self.activations + self.encoder_cache + self.kv_needed


@dataclass(frozen=True)
class MemoryPlan:
    """The lines, the peak and what decided it."""

    architecture: Architecture
    settings: RunSettings
    device: Device
    tokens: Tokens
    lines: tuple[Line, ...]
    engine: EngineCheck | None = None
    phase_totals: dict[str, float] = field(default_factory=dict)

    @property
    def peak(self) -> float:
        return max(self.phase_totals.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phase_totals, key=lambda phase: self.phase_totals[phase])

    @property
    def headroom(self) -> float:
        return self.device.memory - self.peak

    @property
    def engine_fits(self) -> bool:
        return self.engine is None or self.engine.fits

    @property
    def fits(self) -> bool:
        return self.headroom >= 0 and self.engine_fits


# -- token counts ---------------------------------------------------------------------------------
def video_tokens(vision: VisionModel, num_frames: int, max_pixels_per_frame: int) -> int:
    """Merged visual tokens of one video: ``frames / 2`` temporal patches of at most
    ``max_pixels / (28 x 28)`` tokens (frames are resized into the budget, sides multiples of 28).

    >>> video_tokens(VisionModel(32, 1280, 3420, 16, 3584), 512, 128 * 28 * 28)
    32768
    """
    return (num_frames // vision.temporal_patch_size) * (max_pixels_per_frame // vision.pixels_per_token)


def token_counts(arch: Architecture, run: RunSettings) -> Tokens:
    """Tokens of one step on one rank (the worst rank: the one holding the completions). A
    tool-use episode is planned at its budgets: every request made and served, every turn at
    ``completion_tokens``, each episode served frames of its own (a span two episodes share is
    encoded once: fewer patches)."""
    vision = arch.vision
    video = video_tokens(vision, run.num_frames, run.max_pixels_per_frame)
    timestamps = run.num_frames // vision.temporal_patch_size * vision.text_tokens_per_temporal_patch
    prompt = video + run.text_tokens + timestamps
    completion = run.completion_tokens * (run.tool_calls + 1)
    served = replies = 0
    if run.tool_calls:
        served = video_tokens(vision, run.tool_frames, run.max_pixels_per_frame)
        written_times = run.tool_frames // vision.temporal_patch_size * vision.text_tokens_per_temporal_patch
        replies = served + written_times + run.tool_calls * TOOL_REPLY_TEXT_TOKENS
    sp = run.sequence_parallel_size
    if run.kind == "grpo":
        total_rows = run.batch_size * run.num_generations
        rows = min(run.micro_batch_rows or total_rows, total_rows)
        if run.shared_prompt_pass:
            g = run.num_generations
            aligned = g % rows == 0 or rows % g == 0
            prompts = min(run.batch_size, -(-rows // g) + (0 if aligned else 1))
            layer_tokens = prompts * prompt + rows * (replies + completion)
        else:
            layer_tokens = -(-rows * (prompt + replies + completion) // sp)
    else:
        rows = run.batch_size
        layer_tokens = -(-rows * (prompt + completion) // sp)
    # The last slice of a sequence-parallel row holds its completion: one rank computes them all.
    logit_positions = rows * completion
    # The batch's videos are encoded once per step, their temporal patches dealt to the SP ranks;
    # so are the episodes' served segments.
    encoded = run.batch_size * (video + run.num_generations * served)
    patches = -(-encoded * vision.spatial_merge_size**2 // sp)
    return Tokens(video, prompt, completion, rows, layer_tokens, logit_positions, patches, replies, served)


# -- per-token activation counts ------------------------------------------------------------------
def rms_norm_saved_bytes(hidden: int, compute_bytes: int) -> int:
    """Per token: the float32 input, the reciprocal root, the normalised input in the compute
    dtype, and the output (saved by the projections after it)."""
    return 4 * hidden + 4 + 2 * compute_bytes * hidden


def head_norm_saved_bytes(width: int, heads: int, compute_bytes: int) -> int:
    """Per token, a Qwen3 q or k norm over ``heads`` heads of ``width`` values in all: the float32
    input, a reciprocal root per head, the normalised values in the compute dtype (what the
    weight multiplies). Its output goes to the rotary embedding, which saves only cos and sin."""
    return 4 * width + 4 * heads + compute_bytes * width


def decoder_layer_saved_bytes(text: TextModel, compute_bytes: int, run: RunSettings) -> int:
    """Bytes autograd saves per token in one decoder layer (transformers' Qwen2.5-VL layer, or
    Qwen3-VL's with its q/k norms: :func:`head_norm_saved_bytes`).

    Two RMSNorms (:func:`rms_norm_saved_bytes`); attention keeps the rotated queries and keys,
    the values, the output (which the output projection reads in place) and a float32
    log-sum-exp per head; the MLP keeps gate, activation, up and their product (4 x
    intermediate). Rotary cos/sin are shared by the layers, counted once elsewhere.
    Ulysses keeps its head-split copies (key/value heads repeated when they do not divide by
    the group) and a separate output copy; ring keeps repeated keys/values and a float32 output.
    """
    b, h, q, kv, i = compute_bytes, text.hidden_size, text.q_dim, text.kv_dim, text.intermediate_size
    norms = 2 * rms_norm_saved_bytes(h, b)
    mlp = 4 * b * i
    lse = 4 * text.num_heads
    sp = run.sequence_parallel_size
    if sp == 1:
        attention = 2 * b * q + 2 * b * kv
    elif run.sequence_parallel_attention == "ulysses":
        kv_eff = kv if text.num_kv_heads % sp == 0 else q
        attention = 3 * b * q + 2 * b * kv_eff
    else:  # ring: query, repeated key/value, float32 output, the projection's input copy
        attention = 4 * b * q + 4 * q
    if text.qk_norm:
        norms += head_norm_saved_bytes(q, text.num_heads, b) + head_norm_saved_bytes(kv, text.num_kv_heads, b)
    return norms + attention + lse + mlp


def decoder_layer_backward_bytes(text: TextModel, compute_bytes: int) -> int:
    """Per token, the gradients alive at once in one layer's backward beside its saved tensors:
    two intermediate-sized ones (the MLP's). Measured: one decoder layer of ``bench/plan_check.py``'s
    model (hidden 512, intermediate 1,536, float32) forward and backward at 2,048 and 4,244 tokens
    peaked 108.0 and 223.8 MiB above its input, its saved tensors and this giving 108.1 and 223.9
    (the earlier allowance, three intermediate- and two hidden-sized, planned 128.1 and 265.4)."""
    return compute_bytes * 2 * text.intermediate_size


RING_SCORE_CHUNKS = 2
"""Float32 score chunks ring attention holds at once: its backward turns the scores into the
probabilities and their gradient into the scores' gradient in place (``parallel.ring``).
Measured on an H200 (``bench/gpu_check.py``, ``bench/results/gpu_check/``): 1.98 at the peak, by
the difference between query chunks of 1,024 and 2,048; 6.58 before the chunks were reused in
place (``bench/results/ring_memory/``, on the CPU)."""
RING_SLICE_COPIES = 9
"""Float32 tensors the size of a rank's slice alive beside the score chunks in ring attention's
backward: the queries, keys, values, output gradient and saved output upcast (5) and the three
gradients (3), plus the products' transients, measured as under one more (8.5 to 8.8 slice copies on
an H200, ``bench/results/gpu_check/``)."""
RING_PASS_COPIES = 12
"""Slice-sized float32 tensors at a backward ring hop, when no score chunk is alive: the eight
named above and the received keys, values and their two gradient accumulators."""


def ring_transient_bytes(text: TextModel, run: RunSettings, rows: int, layer_tokens: int) -> int:
    """Ring attention's working set in one layer (its backward, the larger phase): slice-sized
    float32 tensors and :data:`RING_SCORE_CHUNKS` score chunks of the largest product a rank
    computes, per head and row, or the tensors of a ring hop, whichever is larger. In the zigzag
    layout (``parallel.ring``) the largest product is up to ``RING_QUERY_CHUNK`` of its positions
    against half a block (a block wholly in its past) or its second half against a whole block
    (one wholly between its two halves)."""
    if run.sequence_parallel_size == 1 or run.sequence_parallel_attention != "ring":
        return 0
    per_row = layer_tokens // max(rows, 1)
    half = per_row // 2
    entries = max(min(RING_QUERY_CHUNK, per_row) * half, min(RING_QUERY_CHUNK, half) * per_row)
    copy = 4 * text.q_dim * layer_tokens
    scores = RING_SCORE_CHUNKS * 4 * rows * text.num_heads * entries
    return max(RING_SLICE_COPIES * copy + scores, RING_PASS_COPIES * copy)


def logit_bytes_per_position(text: TextModel, compute_bytes: int) -> int:
    """Logits in the compute dtype, their float32 log-softmax (saved), and two float32
    transients of the same size (the upcast in the forward, the gradient in backward)."""
    return (compute_bytes + 12) * text.vocab_size


def vision_working_bytes_per_patch(vision: VisionModel, dtype_bytes: int) -> int:
    """One vision block without autograd: residual and normed input, the qkv and attention
    output, the MLP's intermediate-sized tensors, float32 norm copies; plus the pixel values."""
    h, i = vision.hidden_size, vision.intermediate_size
    return (
        dtype_bytes * (6 * h + vision.mlp_tensors * i)
        + 8 * h
        + vision.patch_values * (PIXEL_VALUES_PER_PATCH_BYTES + dtype_bytes)
    )


def vision_block_saved_bytes(vision: VisionModel, compute_bytes: int) -> int:
    """Per patch, what autograd saves in a trainable vision block (like a decoder layer with
    ``heads = kv heads``; a LayerNorm keeps its input, a float32 mean and reciprocal root, and
    its output, read by the projection after it; a GELU MLP keeps its two projections' inputs)."""
    b, h, i = compute_bytes, vision.hidden_size, vision.intermediate_size
    norm = rms_norm_saved_bytes(h, b) if vision.norm == "rms" else 2 * b * h + 8
    mlp = 4 * b * i if vision.mlp == "gated" else 2 * b * i
    return 2 * norm + 4 * b * h + 4 * vision.num_heads + mlp


# -- the plan -------------------------------------------------------------------------------------
def trainable_parameters(arch: Architecture, run: RunSettings) -> int:
    """Parameters the optimizer updates: the LoRA adapters, or the language model (and a
    trainable vision tower)."""
    if run.lora_rank is not None:
        return arch.text.lora_parameters(run.lora_rank, run.lora_targets)
    return arch.text.parameters() + (0 if run.freeze_vision else arch.vision.parameters())


def plan_memory(arch: Architecture, run: RunSettings, device: Device) -> MemoryPlan:
    """The per-device memory plan of ``run`` on ``device`` (see the module docstring)."""
    tokens = token_counts(arch, run)
    text, vision = arch.text, arch.vision
    master, compute, reduce = (DTYPE_BYTES[d] for d in (run.master_dtype, run.param_dtype, run.reduce_dtype))
    shard = run.shard_size
    trainable = trainable_parameters(arch, run)
    held = text.parameters() + (0 if run.freeze_vision else vision.parameters())
    if run.lora_rank is not None:
        held += trainable  # the frozen base, and the adapters beside it
    on_gpu = 0 if run.cpu_offload else 1
    how = f"/ {shard} ranks" if shard > 1 else "not sharded"
    lines = [
        Line(
            "parameters (master)",
            on_gpu * held * master / shard,
            "always",
            f"{held / 1e9:.2f}B x {master} B {how}"
            + (f", {trainable / 1e6:.1f}M of them LoRA adapters" if run.lora_rank is not None else "")
            + (", on the host (cpu_offload)" if run.cpu_offload else ""),
        ),
        Line(
            "optimizer states (AdamW)",
            on_gpu * 2 * trainable * master / shard,
            "always",
            "2 moments x master dtype"
            + (" of the adapters" if run.lora_rank is not None else "")
            + (", on the host (cpu_offload)" if run.cpu_offload else f" {how}"),
        ),
    ]
    if run.freeze_vision:
        vision_bytes = DTYPE_BYTES[run.frozen_vision_dtype or run.master_dtype]
        lines.append(
            Line(
                "vision tower (frozen, replicated)",
                vision.parameters() * vision_bytes,
                "always",
                f"{vision.parameters() / 1e9:.3f}B x {vision_bytes} B on every rank",
            )
        )
    if run.reference != "none":
        # (The reference has no vision tower: it only scores rows with cached video embeddings.)
        reference = arch.text.parameters() * compute / shard if run.reference == "sharded" else 0.0
        lines.append(
            Line(
                "reference model",
                reference,
                "always",
                f"compute dtype {how}" if run.reference == "sharded" else "on the host, streamed per block",
            )
        )
    video_bytes = DTYPE_BYTES[run.frozen_vision_dtype or run.master_dtype] if run.freeze_vision else compute
    # GRPO keeps the encoding for the whole step (rollouts, reference, policy); SFT's forward
    # consumes it before the layers store anything.
    levels = 1 + vision.deepstack_levels
    served = run.num_generations * tokens.served_video
    lines.append(
        Line(
            "video embeddings",
            run.batch_size * (tokens.video + served) * levels * vision.out_hidden_size * video_bytes,
            "always" if run.kind == "grpo" else "rollout",
            f"{run.batch_size} x {tokens.video:,} tokens"
            + (f" (+ {served:,} served to its episodes)" if served else "")
            + f" x {vision.out_hidden_size}"
            + (f" x {levels} levels (the embedding and its DeepStack features)" if levels > 1 else "")
            + ", every rank"
            + (", cached for the step" if run.kind == "grpo" else ""),
        )
    )
    lines += _training_lines(arch, run, tokens, master, compute, reduce, shard, on_gpu)
    lines += _encoding_lines(arch, run, tokens)
    engine = None
    if device.kind == "cuda" and run.kind == "grpo" and run.engine is not None:
        engine = engine_check(arch, run, tokens, device)
        largest = max(text.embedding_parameters(), text.head_parameters(), text.layer_parameters())
        lines.append(
            Line(
                "weight sync buffer",
                largest * (master + DTYPE_BYTES[run.engine.dtype]),
                "sync",
                f"the largest parameter gathered in full ({largest / 1e6:.0f}M) + its engine-dtype copy",
            )
        )
        lines += _engine_lines(arch, run, engine)
    if run.kind == "grpo" and run.policy_generates:
        lines += _generation_lines(arch, run, tokens, held, compute)
    if run.validation is not None:
        lines += _validation_lines(arch, run, held, compute)
    if device.kind == "cuda":
        # Fragmentation of the trainer's own tensors (vLLM's share is its own pool).
        trainer_peak = max(_phase_totals(run, [line for line in lines if line.name != ENGINE_LINE]).values())
        groups = 1 + (run.world_size // run.sequence_parallel_size > 1) + 2 * (run.sequence_parallel_size > 1)
        lines.append(
            Line(
                "framework overhead",
                CUDA_CONTEXT + groups * NCCL_PER_GROUP + FRAGMENTATION * trainer_peak,
                "always",
                f"CUDA context and workspaces {CUDA_CONTEXT / GIB:g} GiB, NCCL {groups} group(s) x "
                f"{NCCL_PER_GROUP / GIB:g} GiB, {FRAGMENTATION:.0%} fragmentation of the trainer's peak "
                "(allowances)",
            )
        )
    return MemoryPlan(arch, run, device, tokens, tuple(lines), engine, _phase_totals(run, lines))


def _generation_lines(
    arch: Architecture, run: RunSettings, tokens: Tokens, held: int, compute: int
) -> list[Line]:
    """Sampling with the policy itself (the transformers engine), in the rollout phase: under
    sharding the whole model gathered in the compute dtype on every rank, and the KV cache of
    one prompt's G samples (the engine batches a prompt's samples together).

    Measured on an H200 at Qwen2.5-VL-3B's widths (FSDP2 over one rank, G = 8, 331 tokens a
    row): the rollout peak was 6.65 GiB above what is held between steps; these lines plan
    5.84 GiB (``bench/results/grpo_3b_cuda``)."""
    lines = []
    if run.sharding != "replicated":
        lines.append(
            Line(
                "policy gathered for generation",
                held * compute,
                "rollout",
                f"{held / 1e9:.2f}B x {compute} B on every rank: every FSDP unit unsharded while the "
                "policy samples (the transformers engine)",
            )
        )
    row = tokens.row
    lines.append(
        Line(
            "generation KV cache",
            run.num_generations * row * arch.text.kv_bytes_per_token(compute),
            "rollout",
            f"{run.num_generations} samples x {row:,} tokens of one prompt, compute dtype",
        )
    )
    return lines


def _phase_totals(run: RunSettings, lines: list[Line]) -> dict[str, float]:
    """Bytes held in each phase the run has (no sync without an engine, no validation unless it
    validates)."""
    present = [
        phase
        for phase in PHASES
        if (phase != "sync" or any(line.phase == "sync" for line in lines))
        and (phase != "validation" or run.validation is not None)
    ]
    return {phase: sum(line.bytes for line in lines if line.held_in(phase)) for phase in present}


def _engine_lines(arch: Architecture, run: RunSettings, engine: EngineCheck) -> list[Line]:
    """The colocated vLLM: its share while it samples; with sleep mode, from the weight sync to the
    next rollout only its weights (the KV cache wakes with the next rollout: a validation in
    between runs without it); what it holds outside its share."""
    assert run.engine is not None
    asleep = run.engine.sleep_mode
    lines = [
        Line(
            ENGINE_LINE,
            engine.reserved,
            "rollout" if asleep else "always",
            f"gpu_memory_utilization {run.engine.gpu_memory_utilization:g} of the device"
            + ("; asleep while training" if asleep else ""),
        ),
        Line(
            "vLLM outside its share",
            VLLM_OUTSIDE_SHARE,
            "always",
            "its engine process's context, what sleep keeps (an allowance)",
        ),
    ]
    if asleep:
        lines.append(
            Line(
                "vLLM weights (awake, KV cache asleep)",
                engine.weights,
                "between",
                "woken for the weight sync; the KV cache waits for the next rollout",
            )
        )
        if run.validation is not None and run.validation.sanity_check:
            lines.append(
                Line(
                    "vLLM rest of its share (sanity check)",
                    engine.reserved - engine.weights,
                    "validation",
                    "the sanity check validates with the engine just started, wholly awake "
                    "(trainer.num_sanity_val_steps: 0 avoids it)",
                )
            )
    return lines


def decoder_layer_forward_bytes(text: TextModel, compute_bytes: int) -> int:
    """Per token, one decoder layer's forward without autograd at its fullest (the MLP): the
    residual stream and the normed input, and three intermediate-sized tensors (the activated
    gate, the up projection and their product)."""
    return compute_bytes * (2 * text.hidden_size + 3 * text.intermediate_size)


def _validation_lines(arch: Architecture, run: RunSettings, held: int, compute: int) -> list[Line]:
    """A validation between steps (:class:`ValidationSettings`): the policy gathered on every rank,
    the batch's videos encoded over the sequence-parallel group and cached whole, then the larger
    of a question's decoding (its prompt prefilled as ``samples`` copies, their KV cache) and the
    batch's teacher-forced loss forward (no autograd: one layer's working set, the targets' logits)."""
    val = run.validation
    assert val is not None
    text, vision = arch.text, arch.vision
    video = video_tokens(vision, val.num_frames, run.max_pixels_per_frame)
    times = val.num_frames // vision.temporal_patch_size * vision.text_tokens_per_temporal_patch
    prompt = video + run.text_tokens + times
    lines = []
    if run.sharding != "replicated":
        lines.append(
            Line(
                "policy gathered for validation",
                held * compute,
                "validation",
                f"{held / 1e9:.2f}B x {compute} B on every rank (no collective may run inside a validation)",
            )
        )
    vision_bytes = DTYPE_BYTES[run.frozen_vision_dtype or run.master_dtype] if run.freeze_vision else compute
    patches = -(-val.batch_size * video * vision.spatial_merge_size**2 // run.sequence_parallel_size)
    levels = 1 + vision.deepstack_levels
    encoded = val.batch_size * video * levels * vision.out_hidden_size * vision_bytes
    at_once = patches_per_pass(vision, run, patches)
    lines.append(
        Line(
            "validation videos",
            encoded + at_once * vision_working_bytes_per_patch(vision, vision_bytes),
            "validation",
            f"{val.batch_size} x {video:,} tokens encoded over the sequence-parallel group "
            f"({patches:,} patches here) and cached whole",
        )
    )
    rows = max(1, val.samples)
    decoding = (
        rows * (prompt + val.max_new_tokens) * text.kv_bytes_per_token(compute)
        + rows * prompt * (decoder_layer_forward_bytes(text, compute) + text.hidden_size * compute)
        + rows * text.vocab_size * (compute + 4)
    )
    loss_tokens = val.batch_size * (prompt + val.target_tokens)
    # The loss forward is the model's own (pixel values in): it encodes the batch's whole videos
    # again, on every rank and in one pass, before its layers run.
    whole_patches = val.batch_size * video * vision.spatial_merge_size**2
    layers = loss_tokens * (decoder_layer_forward_bytes(text, compute) + text.hidden_size * compute)
    logits = val.batch_size * val.target_tokens * text.vocab_size * (compute + 2 * 4)
    loss = max(whole_patches * vision_working_bytes_per_patch(vision, vision_bytes), layers + logits)
    lines.append(
        Line(
            "validation decoding or loss forward",
            max(decoding, loss),
            "validation",
            f"decoding {format_gib(decoding)} ({rows} cop{'ies' if rows > 1 else 'y'} of a {prompt:,}-token "
            f"prompt prefilled, KV cache to {val.max_new_tokens:,} new tokens), loss forward "
            f"{format_gib(loss)} (the model's own: its {whole_patches:,} patches encoded again, then "
            f"{val.batch_size} x {prompt + val.target_tokens:,} tokens, logits of {val.target_tokens:,} "
            "targets): the larger",
        )
    )
    return lines


def _training_lines(
    arch: Architecture,
    run: RunSettings,
    tokens: Tokens,
    master: int,
    compute: int,
    reduce: int,
    shard: int,
    on_gpu: int,
) -> list[Line]:
    text, vision = arch.text, arch.vision
    trainable = trainable_parameters(arch, run)
    lines = [
        Line(
            "gradients (master dtype)",
            on_gpu * trainable * master / shard,
            "backward",
            "sharded like the parameters" + (", on the host" if run.cpu_offload else ""),
        )
    ]
    if run.sharding == "replicated":
        lines.append(Line("gradient reduction buffer", trainable * master, "backward", "a flat copy (DDP)"))
    else:
        # lvrl's layout (parallel.sharding): one unit per decoder block and a root unit holding
        # the embeddings and the head, gathered from the step's forward to the end of its
        # backward (its gradients reduce once, when backward ends, so the head's gradient is
        # held, unsharded, until then). Through the head: the root gathered, the last block
        # prefetched, the head's gradient. Through a block: the same root and head gradient, two
        # blocks gathered, the block's gradient, and the previous block's reduce-scatter input,
        # which FSDP2 keeps until the next unit reduces.
        head = text.embedding_parameters() if text.tied_embeddings else text.head_parameters()
        root = text.embedding_parameters() + (0 if text.tied_embeddings else text.head_parameters())
        block = text.layer_parameters()  # vision blocks, when trained, are smaller
        lines.append(
            Line(
                "FSDP2 buffers at the head",
                (root + block + head) * compute,
                "head",
                f"root unit (embeddings + head, {root / 1e6:.0f}M) gathered for the step + next block "
                "prefetched, the head's gradient",
            )
        )
        lines.append(
            Line(
                "FSDP2 buffers at a block",
                (root + head + 3 * block) * compute + block * reduce,
                "layers",
                f"the root still gathered and the head's gradient held; block ({block / 1e6:.0f}M) gathered "
                "+ next prefetched, its gradient, the previous block's reduce-scatter input",
            )
        )
        # When backward ends the root reduces: its parameters, its whole gradient (embeddings and
        # head) and that gradient's reduce-scatter input are alive at once, every activation gone.
        lines.append(
            Line(
                "FSDP2 buffers as backward ends",
                root * (2 * compute + reduce) + block * reduce,
                "end",
                "the root's parameters, its whole gradient and its reduce-scatter input",
            )
        )
    t = tokens.layer_tokens
    saved = decoder_layer_saved_bytes(text, compute, run)
    if run.gradient_checkpointing:
        stored = text.num_layers * t * compute * text.hidden_size
        note = f"{text.num_layers} layer inputs x {t:,} tokens"
    else:
        stored = text.num_layers * t * saved
        note = f"{text.num_layers} layers x {t:,} tokens x {saved:,} B"
    lines.append(Line("activations: decoder layers", stored, "training", note))
    working = t * ((saved if run.gradient_checkpointing else 0) + decoder_layer_backward_bytes(text, compute))
    working += ring_transient_bytes(text, run, tokens.rows, t)
    lines.append(
        Line(
            "activations: one layer's working set",
            working,
            "layers",
            ("recomputed layer + " if run.gradient_checkpointing else "")
            + "backward gradients"
            + (
                " + ring score chunks"
                if run.sequence_parallel_attention == "ring" and run.sequence_parallel_size > 1
                else ""
            ),
        )
    )
    whole_rows = tokens.rows * tokens.row
    per_token_model = rms_norm_saved_bytes(text.hidden_size, compute) + 2 * text.head_dim * compute
    model_level = whole_rows * text.hidden_size * compute + t * per_token_model
    if run.shared_prompt_pass and run.kind == "grpo":
        # Each row's copy of its prompt's keys/values and the concatenated cache, every layer.
        model_level += (
            text.num_layers
            * (2 * tokens.rows * tokens.prompt + tokens.rows * (tokens.replies + tokens.completion))
            * 2
            * text.kv_dim
            * compute
        )
    lines.append(
        Line(
            "activations: embeddings, final norm, rotary",
            model_level,
            "training",
            f"input embeddings of {tokens.rows} whole row(s), {whole_rows:,} tokens"
            + ("; prompt keys/values per row" if run.shared_prompt_pass and run.kind == "grpo" else ""),
        )
    )
    lines.append(
        Line(
            "logits (completion positions)",
            tokens.logit_positions * logit_bytes_per_position(text, compute),
            "head",
            f"{tokens.logit_positions:,} positions x {text.vocab_size:,} vocabulary",
        )
    )
    if not run.freeze_vision:
        vision_saved = vision_block_saved_bytes(vision, compute)
        patches = tokens.patches * run.sequence_parallel_size  # re-encoded whole on every rank, with grad
        per_block = compute * vision.hidden_size if run.gradient_checkpointing else vision_saved
        lines.append(
            Line(
                "activations: vision tower (trainable)",
                patches * (vision.depth * per_block + vision_saved),
                "training",
                f"{patches:,} patches",
            )
        )
    return lines


def _encoding_lines(arch: Architecture, run: RunSettings, tokens: Tokens) -> list[Line]:
    """The frozen tower's working set while it encodes this rank's share of the frames. GRPO
    encodes in the rollout phase; SFT encodes inside its forward, before the layers store
    anything, so it is counted in the rollout column (the step's other phase) there too."""
    if not run.freeze_vision:
        return []
    dtype_bytes = DTYPE_BYTES[run.frozen_vision_dtype or run.master_dtype]
    at_once = patches_per_pass(arch.vision, run, tokens.patches)
    working = at_once * vision_working_bytes_per_patch(arch.vision, dtype_bytes)
    where = "this rank's" if run.sequence_parallel_size > 1 else "all"
    passes = f" in passes of {at_once:,}" if at_once < tokens.patches else ""
    return [
        Line(
            "vision encoding working set",
            working,
            "rollout",
            f"{where} {tokens.patches:,} patches{passes}, no autograd",
        )
    ]


def patches_per_pass(vision: VisionModel, run: RunSettings, patches: int) -> int:
    """Patches the tower holds at once when it encodes ``patches``: all of them, or passes of
    ``vision_patches_per_pass`` whole temporal patches (one alone may be larger)."""
    if run.vision_patches_per_pass is None:
        return patches
    temporal = (run.max_pixels_per_frame // vision.pixels_per_token) * vision.spatial_merge_size**2
    return min(patches, max(run.vision_patches_per_pass, temporal))


def engine_check(arch: Architecture, run: RunSettings, tokens: Tokens, device: Device) -> EngineCheck:
    """What vLLM needs inside its reservation for this rank's share of the rollouts.

    Sequence-parallel peers split the prompts (``share_out``), so one engine samples the G
    completions of ``ceil(batch / sp)`` prompts. With prefix caching each prompt's KV is
    stored once and each sample adds its completion; vLLM also refuses to start unless one
    ``max_model_len`` sequence fits its KV cache.
    """
    assert run.engine is not None
    engine, text = run.engine, arch.text
    eb = DTYPE_BYTES[engine.dtype]
    prompts = -(-run.batch_size // run.sequence_parallel_size)
    g = run.num_generations
    # With prefix caching a sample adds its replies and turns to its prompt's shared KV.
    shared = prompts * (tokens.prompt + g * (tokens.replies + tokens.completion))
    kv_tokens = shared if engine.prefix_caching else prompts * g * tokens.row
    kv_tokens = max(kv_tokens, engine.max_model_len or tokens.row)
    h, q, kv, i = text.hidden_size, text.q_dim, text.kv_dim, text.intermediate_size
    activations = (engine.batched_tokens or ENGINE_BATCHED_TOKENS) * (2 * h + q + 2 * kv + 2 * i) * eb
    activations += engine.max_num_seqs * text.vocab_size * 8 + ENGINE_FIXED_OVERHEAD
    return EngineCheck(
        reserved=engine.gpu_memory_utilization * device.memory,
        weights=arch.parameters() * eb,
        activations=activations,
        encoder_cache=prompts
        * (tokens.video + g * tokens.served_video)
        * (1 + arch.vision.deepstack_levels)
        * arch.vision.out_hidden_size
        * eb,
        kv_needed=kv_tokens * text.kv_bytes_per_token(eb),
        kv_tokens=kv_tokens,
        max_model_len_needed=tokens.row,
    )


def format_gib(value: float) -> str:
    """``12.34 GiB``.

    >>> format_gib(3 * GIB / 2)
    '1.50 GiB'
    """
    return f"{value / GIB:.2f} GiB"


def format_count(value: int) -> str:
    """A parameter count as people write it.

    >>> format_count(8_292_166_656), format_count(73_700_000), format_count(913_856)
    ('8.29B', '73.7M', '914K')
    """
    if value >= 1e9:
        return f"{value / 1e9:.2f}B"
    if value >= 1e6:
        return f"{value / 1e6:.1f}M"
    return f"{value / 1e3:.0f}K"


def ceil_fraction(value: float, step: float = 0.01) -> float:
    """``value`` rounded up to a multiple of ``step`` (for a suggested utilisation).

    >>> ceil_fraction(0.4312)
    0.44
    """
    return round(math.ceil(value / step - 1e-9) * step, 10)
