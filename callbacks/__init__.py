"""Lightning callbacks: checkpoints in the run folder, HF export, data-quality logging (RL rollouts later)."""
