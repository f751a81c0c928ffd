"""LoRA adapters (through PEFT) on the policy: settings, injection, the adapter-free view, export.

Injection is in place (``peft.inject_adapter_in_model``), not through a ``PeftModel`` wrapper:
the Hugging Face model keeps its class and its attribute paths (``model.model.visual``,
``model.model.language_model.layers``), which the vision helpers, the sharding layout, the
scoring code and the engines use. Each adapted ``nn.Linear`` becomes a PEFT ``lora.Linear``
holding the original layer as ``base_layer`` and the adapter as ``lora_A``/``lora_B``, so only
the adapted layers' parameter names change (``...q_proj.weight`` -> ``...q_proj.base_layer.weight``
plus ``...q_proj.lora_A.default.weight`` and ``...lora_B.default.weight``).

What LoRA changes elsewhere, and where:

- only adapter parameters require grad (the base, vision tower included unless ``vision``, is
  frozen), so the optimizer, gradients and checkpoint's optimizer state cover the adapters alone;
- the GRPO reference is the same model with its adapters disabled (:func:`base_model`), not a
  second copy (:mod:`models.grpo`);
- the rollout engine receives merged weights under the base names
  (:func:`engine_weights`);
- an export writes the merged model (a plain Hugging Face directory) and the adapter in PEFT's
  format under ``<out>/adapter`` (:func:`models.export.save_hf_model`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.settings import settings_block
from models.vision import decoder_blocks, vision_tower
from parallel.sharding import full_tensor

LANGUAGE_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The language model's attention and MLP projections (Qwen2-VL, Qwen2.5-VL, Qwen3-VL names)."""

ADAPTER_NAME = "default"
"""PEFT's name of the one adapter lvrl trains."""

# Module wrappers that insert a level into parameter names (activation checkpointing, and
# torch.compile): the engine knows the Hugging Face names only.
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def hf_name(name: str) -> str:
    """``name`` without the levels that activation-checkpointing and compile wrappers insert."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def engine_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters an update can change, with HF names, in ``named_parameters`` order (the
    same on every rank): all an engine needs after it loaded the rest from ``model_path``.

    A model with LoRA adapters gives the engine merged weights instead
    (:func:`merged_lora_parameters`): the engine keeps serving a plain model. What
    :func:`rollout.weight_sync.sync_weights` streams after each update.
    """
    layers = lora_layers(model)
    if layers:
        yield from merged_lora_parameters(model, layers)
        return
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            yield hf_name(name), parameter


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The PEFT LoRA layers of ``model`` by HF module path (empty without adapters)."""
    from peft.tuners.lora import LoraLayer

    return {hf_name(path): module for path, module in model.named_modules() if isinstance(module, LoraLayer)}


def merged_lora_weight(
    base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float
) -> torch.Tensor:
    """``base + scaling * lora_b @ lora_a`` (full tensors), computed in at least float32 and
    returned in ``base``'s dtype: the weight of a plain layer that computes what the adapted
    one does (up to rounding: the adapted layer adds ``scaling * B(A x)`` to ``W x``)."""
    wide = torch.promote_types(base.dtype, torch.float32)
    return (base.to(wide) + (lora_b.to(wide) @ lora_a.to(wide)) * scaling).to(base.dtype)


def merged_lora_parameters(
    model: torch.nn.Module, layers: Mapping[str, torch.nn.Module]
) -> Iterator[tuple[str, torch.Tensor]]:
    """What the engine needs from a model with LoRA ``layers``: merged weights under the base
    names, never the adapters themselves.

    Engine-side adapters were the alternative (vLLM serves LoRA on some builds); merged weights
    need nothing of the engine beyond the weight reload every full fine-tuning sync already
    uses, and the engine then samples at full speed with no adapter kernels.

    Each parent module of an adapted layer (a decoder block's ``self_attn`` or ``mlp``) is sent
    whole: every parameter under it, each adapted layer's weight merged and its bias as it is.
    vLLM rebuilds a fused layer (``qkv_proj``: q, k, v weights and biases) from what one reload
    call brings, so a partly sent layer would come back with uninitialised parts; the fused
    layers are siblings under one parent, so whole parents keep them whole whatever subset the
    adapters target. Nothing is modified in place: the merged tensors are new. Sharded
    parameters are gathered here (collectives, in the same order on every rank) and the merge
    is computed on the full tensors, in float32 at least. Any other trainable parameter follows
    as it is.
    """
    parents: dict[str, torch.nn.Module] = {}
    for path, module in model.named_modules():
        if layers.get(hf_name(path)) is module:
            parent_path = path.rpartition(".")[0]
            parents.setdefault(parent_path, model.get_submodule(parent_path) if parent_path else model)
    sent: set[str] = set()
    for parent_path, parent in parents.items():
        for name, tensor in _engine_tensors(parent_path, parent, layers):
            if name not in sent:
                sent.add(name)
                yield name, tensor
    for name, parameter in model.named_parameters():
        plain = hf_name(name)
        if (
            parameter.requires_grad
            and ".lora_A." not in plain
            and ".lora_B." not in plain
            and plain not in sent
        ):
            yield plain, parameter


def _engine_tensors(
    prefix: str, module: torch.nn.Module, layers: Mapping[str, torch.nn.Module]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter under ``module`` (at ``prefix``) as the plain model names it, adapted
    layers merged."""
    path = hf_name(prefix)
    if path in layers and module is layers[path]:
        for leaf, parameter in module.base_layer.named_parameters(recurse=False):
            value = full_tensor(parameter, None)
            if leaf == "weight":
                for adapter in module.active_adapters:
                    value = merged_lora_weight(
                        value,
                        full_tensor(module.lora_A[adapter].weight, None),
                        full_tensor(module.lora_B[adapter].weight, None),
                        module.scaling[adapter],
                    )
            yield f"{path}.{leaf}", value
        return
    for leaf, parameter in module.named_parameters(recurse=False):
        yield f"{path}.{leaf}" if path else leaf, parameter
    for child, submodule in module.named_children():
        yield from _engine_tensors(f"{prefix}.{child}" if prefix else child, submodule, layers)


ADAPTER_DIR = "adapter"
"""Where an export puts the adapter, inside the merged model directory."""


@dataclass(frozen=True)
class LoraSettings:
    """The ``lora:`` block of a training module's arguments.

    Attributes:
        r: rank of each adapter (``B @ A`` with ``A``: r x in, ``B``: out x r).
        alpha: the update is scaled by ``alpha / r``.
        dropout: dropout on the adapter's input (0: none; the adapter-free reference and the
            merged engine weights see no dropout either way).
        target_modules: names of the ``nn.Linear`` modules to adapt (the last part of their
            path), matched inside the language model's decoder blocks.
        vision: also adapt the modules of those names inside the vision tower (Qwen2.5-VL's
            vision blocks name their MLP ``gate_proj``/``up_proj``/``down_proj`` and their
            attention ``qkv``/``proj``). Needs ``freeze_vision: false``.
        seed: seed of the adapters' initialisation (``A`` random, ``B`` zero), the same on every
            rank and every run, independent of the global RNG.
    """

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = field(default=LANGUAGE_PROJECTIONS)
    vision: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if self.r < 1:
            raise ValueError(f"lora.r must be at least 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be positive, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules or not all(isinstance(t, str) and t for t in self.target_modules):
            raise ValueError(f"lora.target_modules must be non-empty module names, got {self.target_modules}")

    @classmethod
    def of(cls, value: LoraSettings | Mapping[str, Any] | None) -> LoraSettings | None:
        """The settings of a YAML ``lora:`` block (None: no LoRA, full fine-tuning)."""
        return settings_block(cls, value, "lora")

    @property
    def scaling(self) -> float:
        """The factor of the adapter's update: ``alpha / r``."""
        return self.alpha / self.r

    def target_paths(self, model: torch.nn.Module) -> list[str]:
        """Module paths to adapt: ``target_modules`` inside the decoder blocks (and the vision
        tower with ``vision``), each an ``nn.Linear``."""
        regions = [*decoder_blocks(model)]
        if self.vision:
            regions.append(vision_tower(model))
        region_ids = {id(module) for module in regions}
        prefixes = [path for path, module in model.named_modules() if id(module) in region_ids]
        paths = []
        for path, module in model.named_modules():
            if path.rpartition(".")[2] not in self.target_modules:
                continue
            if not any(path.startswith(f"{prefix}.") for prefix in prefixes):
                continue
            if type(module) is not torch.nn.Linear:
                raise ValueError(
                    f"lora: {path} is a {type(module).__name__}; only nn.Linear layers are adapted"
                )
            paths.append(path)
        if not paths:
            where = "the decoder blocks" + (" or the vision tower" if self.vision else "")
            raise ValueError(f"lora: no module named {list(self.target_modules)} in {where}")
        return paths

    def peft_config(self, model: torch.nn.Module) -> Any:
        """PEFT's ``LoraConfig`` for ``model``: the target modules listed by full path, so that
        no same-named module elsewhere (the vision tower's MLP) is adapted by accident."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_paths(model),
            bias="none",
            init_lora_weights=True,
            base_model_name_or_path=getattr(model.config, "_name_or_path", None) or None,
        )


def apply_lora(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """Inject ``settings``' adapters into ``model`` in place and freeze everything else.

    The adapters start at zero update (``B = 0``), so the model computes what it did before;
    ``A`` is drawn from ``settings.seed`` (the caller's RNG state is left as it was).
    """
    from peft import inject_adapter_in_model

    if lora_layers(model):
        raise ValueError("the model already has LoRA adapters")
    config = settings.peft_config(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    model.requires_grad_(False)
    for parameter in adapter_parameters(model).values():
        parameter.requires_grad_(True)
    return model


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The adapters' parameters (``lora_A``/``lora_B`` weights), by name."""
    return {
        name: parameter
        for name, parameter in model.named_parameters()
        if ".lora_A." in name or ".lora_B." in name
    }


@contextmanager
def base_model(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` as the base computes it, for the block: adapters disabled (each adapted layer
    runs its ``base_layer`` alone, the very module and weights of the base model) and eval mode
    (as the separate reference copy was: no dropout, and transformers keeps the key/value cache
    that shared-prompt scoring reuses). Restored afterwards."""
    layers = list(lora_layers(model).values())
    modes = [(module, module.training) for module in model.modules()]
    with ExitStack() as restore:
        for layer in layers:
            enabled = not layer.disable_adapters
            layer.enable_adapters(False)
            restore.callback(layer.enable_adapters, enabled)
        model.eval()
        for module, training in modes:  # each module's own flag (train() would recurse)
            restore.callback(setattr, module, "training", training)
        yield model


def merged_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (a full state dict of ``model``, adapters included) as the plain base model's:
    each adapted layer's weight merged (``W + scaling * B @ A``) under its base name, its other
    base parameters (bias) renamed back, the adapters dropped."""
    layers = lora_layers(model)
    plain = {hf_name(key): value for key, value in state.items()}
    merged: dict[str, torch.Tensor] = {}
    for key, value in plain.items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        if ".base_layer." not in key:
            merged[key] = value
            continue
        path, _, leaf = key.partition(".base_layer.")
        if leaf == "weight":
            layer = layers[path]
            for adapter in layer.active_adapters:
                value = merged_lora_weight(
                    value,
                    plain[f"{path}.lora_A.{adapter}.weight"],
                    plain[f"{path}.lora_B.{adapter}.weight"],
                    layer.scaling[adapter],
                )
        merged[f"{path}.{leaf}"] = value
    return merged


def save_adapter(model: torch.nn.Module, state: Mapping[str, torch.Tensor], out_dir: str | Path) -> Path:
    """Write the adapter of ``model`` (values from ``state``, a full state dict) in PEFT's format
    (``adapter_config.json``, ``adapter_model.safetensors``): ``PeftModel.from_pretrained(base,
    out_dir)`` loads it onto the base model."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plain = {hf_name(key): value for key, value in state.items()}
    adapter = get_peft_model_state_dict(model, state_dict=plain, adapter_name=ADAPTER_NAME)
    # PeftModel's own names: the wrapped model sits at ``base_model.model``.
    save_file(
        {f"base_model.model.{key}": value.detach().cpu().contiguous() for key, value in adapter.items()},
        str(out / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
    model.peft_config[ADAPTER_NAME].save_pretrained(str(out))
    return out


def parameter_bytes(parameters: Iterator[torch.nn.Parameter] | list[torch.nn.Parameter]) -> int:
    """Bytes the given parameters occupy (their values only)."""
    return sum(p.numel() * p.element_size() for p in parameters)
