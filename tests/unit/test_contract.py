"""The typed contract between the sequence-parallel strategy and the module (parallel/contract.py)."""

from __future__ import annotations

import json

import pytest
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies import DDPStrategy

from models.vlm_module import VLMModule
from parallel.contract import (
    AttentionHeads,
    SequenceParallelModule,
    ShardableModule,
    ShardingStrategy,
    require_sequence_parallel_module,
)
from parallel.strategy import SequenceParallelStrategy


def test_vlm_module_implements_the_module_side(tiny_model_dir) -> None:
    module = VLMModule(str(tiny_model_dir))
    assert isinstance(module, SequenceParallelModule)
    assert require_sequence_parallel_module(module, "S") is module
    assert module.attention_heads() is None  # no model yet
    module.configure_model()
    text = json.loads((tiny_model_dir / "config.json").read_text())
    text = text.get("text_config", text)
    expected = AttentionHeads(text["num_attention_heads"], text["num_key_value_heads"])
    assert module.attention_heads() == expected
    assert module.supports_sequence_parallel is False and module.sequence_shard is None


def test_a_module_without_the_contract_is_refused_by_name() -> None:
    module = LightningModule()
    assert not isinstance(module, SequenceParallelModule)
    with pytest.raises(TypeError, match=r"SequenceParallelStrategy needs .*LightningModule lacks "
                       r"supports_sequence_parallel, sequence_shard, attention_heads"):  # fmt: skip
        require_sequence_parallel_module(module, "SequenceParallelStrategy")


def test_the_strategy_shards_and_the_module_can_be_sharded(tiny_model_dir) -> None:
    assert isinstance(SequenceParallelStrategy(sequence_parallel_size=1), ShardingStrategy)
    assert not isinstance(DDPStrategy(), ShardingStrategy)  # replicates; the module stays whole
    assert isinstance(VLMModule(str(tiny_model_dir)), ShardableModule)
    assert not isinstance(LightningModule(), ShardableModule)


def test_training_a_module_that_does_not_split_sequences_is_refused(tiny_model_dir) -> None:
    """SFT does not score with a shard: its peers would each add the whole gradient (validation may)."""
    from models.grpo import GRPOModule
    from models.sft import SFTModule
    from parallel.strategy import check_module_fits

    sft = SFTModule(str(tiny_model_dir))
    with pytest.raises(ValueError, match="SFTModule does not split sequences across ranks"):
        check_module_fits(sft, 2, "ulysses", fitting=True)
    check_module_fits(sft, 2, "ulysses", fitting=False)  # evaluating on split ranks is fine
    check_module_fits(sft, 1, "ulysses", fitting=True)  # no split: plain data parallelism
    check_module_fits(GRPOModule(str(tiny_model_dir)), 2, "ulysses", fitting=True)
