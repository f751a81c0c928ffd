"""The evaluation report: a JSON file, a markdown table and a bar chart per validation, also sent to wandb.

Written by :class:`EvaluationReport` after every validation (``lvrl validate`` runs one) from
the module's :attr:`~models.vlm_module.VLMModule.val_results`; what the report holds and how it
is laid out is :mod:`evaluation.report`'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from evaluation.report import bar_chart, evaluation_summary, markdown_table


class EvaluationReport(Callback):
    """Writes ``{name}.json``, ``{name}.md`` and ``{name}.png`` after each validation; logs them to wandb.

    Args:
        out_dir: folder of the files; default ``{trainer.default_root_dir}/eval``.
        name: file name stem (a run that validates during fit overwrites them each time).
    """

    def __init__(self, out_dir: str | None = None, name: str = "eval") -> None:
        self.out_dir = out_dir
        self.name = name
        self.written: list[Path] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        results = getattr(pl_module, "val_results", None)
        if trainer.sanity_checking or not results or not trainer.is_global_zero:
            return
        folder = Path(self.out_dir or Path(trainer.default_root_dir) / "eval")
        folder.mkdir(parents=True, exist_ok=True)
        model = str(getattr(pl_module.hparams, "model_path", type(pl_module).__name__))
        summary = evaluation_summary(results, model, trainer.global_step)
        table = markdown_table(summary)
        paths = [folder / f"{self.name}.{ext}" for ext in ("json", "md", "png")]
        paths[0].write_text(json.dumps(summary, indent=2) + "\n")
        paths[1].write_text(table)
        bar_chart(summary, paths[2])
        self.written = paths
        rank_zero_info(f"\n{table}\nevaluation report: {', '.join(str(p) for p in paths)}")
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                self._log_to_wandb(logger, summary, paths[2])

    @staticmethod
    def _log_to_wandb(logger: WandbLogger, summary: dict[str, Any], chart: Path) -> None:
        columns = ["frames", "category", "questions", "accuracy"]
        data = [
            [e["frames"] or 0, category, values["count"], values["accuracy"]]
            for e in summary["evaluations"]
            for category, values in [
                *e["per_category"].items(),
                ("overall", {"count": e["questions"], "accuracy": e["accuracy"]}),
            ]
        ]
        logger.log_table(key="eval/accuracy_table", columns=columns, data=data)
        logger.log_image(key="eval/accuracy_chart", images=[str(chart)])
