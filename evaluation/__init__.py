"""Evaluation: answers scored by problem type, metrics, the per-question evaluator, reports, tables.

- :mod:`evaluation.scoring`: one answer scored the way its problem type allows.
- :mod:`evaluation.metrics`: :class:`~evaluation.metrics.MultipleChoiceScores` (a torchmetric)
  and the accuracy table ``lvrl validate`` prints.
- :mod:`evaluation.evaluator`: :class:`~evaluation.evaluator.Evaluator`, what a module's
  validation hooks delegate to, and the per-question predictions files.
- :mod:`evaluation.report`: the JSON summary, markdown table and chart of a validation.
- :mod:`evaluation.tables`: the one table renderer (markdown or plain text).

Imports core, rewards and rollout, never models: the module hands the evaluator its answers.
"""
