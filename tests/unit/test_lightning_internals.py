"""The protected Lightning members lvrl still uses, each where Lightning 2.6 offers no public hook.

Every use carries a comment saying which public hook is missing. These tests fail loudly when a
Lightning upgrade renames one, changes its signature or changes the body lvrl follows, instead
of letting a run misbehave quietly:

- ``parallel/strategy.py``: ``ModelParallelStrategy._configure_launcher`` (the layout refused
  while the Trainer is built), its ``setup_environment`` body (followed with our own mesh:
  ``_setup_distributed``, ``_device_mesh``);
- ``callbacks/checkpoint.py``: ``ModelCheckpoint._find_last_checkpoints`` (where ``--ckpt_path
  last`` looks), ``_save_last_checkpoint`` with ``_monitor_candidates`` (``last.ckpt`` written on
  pre-emption) and ``_last_global_step_saved``.
"""

from __future__ import annotations

import hashlib
import inspect

import lightning as L
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.connectors import checkpoint_connector

from parallel.strategy import SequenceParallelStrategy

SETUP_ENVIRONMENT_SHA256 = "508f608433d9c45d"
"""The start of the SHA-256 of ``ModelParallelStrategy.setup_environment``'s source in Lightning
2.6.6, the body ``SequenceParallelStrategy.setup_environment`` follows."""


def parameters(function: object) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]  # type: ignore[arg-type]


def test_the_strategy_refuses_a_bad_layout_while_the_trainer_is_built() -> None:
    # Through _configure_launcher: before any process is launched.
    with pytest.raises(ValueError, match="sequence_parallel_size=3 does not divide the world size 2"):
        L.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=SequenceParallelStrategy(sequence_parallel_size=3),
            logger=False,
            enable_checkpointing=False,
        )
    assert parameters(ModelParallelStrategy._configure_launcher) == []


def test_the_model_parallel_setup_environment_is_the_body_lvrl_follows() -> None:
    source = inspect.getsource(ModelParallelStrategy.setup_environment)
    digest = hashlib.sha256(source.encode()).hexdigest()
    assert digest.startswith(SETUP_ENVIRONMENT_SHA256), (
        "Lightning changed ModelParallelStrategy.setup_environment: read it again and bring "
        f"parallel/strategy.py's SequenceParallelStrategy.setup_environment in line, then pin {digest[:16]}"
    )
    assert parameters(ModelParallelStrategy._setup_distributed) == []
    assert "_device_mesh" in inspect.getsource(L.LightningModule.device_mesh.fget)  # type: ignore[attr-defined]


def test_model_checkpoint_keeps_the_members_run_checkpoint_uses() -> None:
    checkpoint = ModelCheckpoint()
    assert hasattr(checkpoint, "_last_global_step_saved")
    assert parameters(ModelCheckpoint._save_last_checkpoint) == ["trainer", "monitor_candidates"]
    assert parameters(ModelCheckpoint._monitor_candidates) == ["trainer"]
    assert parameters(ModelCheckpoint._find_last_checkpoints) == ["trainer"]
    # `--ckpt_path last` is resolved through it.
    assert "_find_last_checkpoints" in inspect.getsource(checkpoint_connector)
