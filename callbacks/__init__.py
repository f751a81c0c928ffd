"""Lightning callbacks: RL rollouts, run-folder checkpoints, HF export, data-quality logging, the
evaluation report, progress lines, device memory, the engine's admission check, early stopping with
a floor of steps."""
