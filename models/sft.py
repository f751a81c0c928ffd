"""CoT-SFT: teach the model to write ``<think>reasoning</think><answer>X</answer>`` for a video question."""

from __future__ import annotations

from typing import Any

import torch

from models.vlm_module import VLMModule


class SFTModule(VLMModule):
    """Supervised fine-tuning on reasoning + answer; the loss covers only the assistant tokens.

    The collator sets ``labels`` to -100 on the prompt (system, question, video) and padding,
    so the token-mean cross-entropy is over the chain of thought, the answer and the
    end-of-turn token. Arguments are those of :class:`~models.vlm_module.VLMModule`.
    """

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor | None:
        loss = self.token_loss_share(batch)
        batch_size = batch["input_ids"].shape[0]
        # Every rank must take the same decision (a rank that skips would leave the others
        # waiting in the gradient all-reduce).
        nonfinite = self.trainer.strategy.reduce((~torch.isfinite(loss.detach())).float(), reduce_op="sum")
        self.log("train/nonfinite_skipped", float(self.nonfinite_skipped), batch_size=batch_size)
        if float(nonfinite) > 0:
            self.skip_nonfinite_update("loss")
            return None  # Lightning skips the backward pass and the optimizer step
        self.note_finite_update()
        # (A share per rank when the model is sharded: the logged loss is the whole batch's.)
        self.log("train/loss", self.sum_over_data(loss.detach()), prog_bar=True, batch_size=batch_size)
        self.log("train/target_tokens", (batch["labels"] != -100).sum().float(), batch_size=batch_size)
        # The optimizer step this batch makes (Lightning's logger "step" can run one ahead after a resume).
        self.log("train/global_step", float(self.global_step), batch_size=batch_size)
        self.log(
            "train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], prog_bar=True, batch_size=batch_size
        )
        return loss
