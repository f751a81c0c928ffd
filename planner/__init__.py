"""``lvrl plan`` and the start-up memory check: what a run needs per device, phase by phase.

- :mod:`planner.memory`: the plan itself, pure arithmetic over an :class:`~planner.memory.Architecture`
  and a run's :class:`~planner.memory.RunSettings` (weights, optimizer, activations, the engine's
  KV cache, validation), checked against measured peaks (``bench/plan_check.py``).
- :mod:`planner.advice`: what to change when a plan does not fit, each change priced by
  planning again.
- :mod:`planner.architectures`: a model's sizes from its ``config.json``, or a published
  model's.
- :mod:`planner.run_config`: the :class:`~planner.memory.RunSettings` of an ``lvrl fit`` config
  as LightningCLI parses it (every class's defaults filled in by its own signature), and the
  check ``lvrl fit`` runs before anything loads on a CUDA GPU.
"""
