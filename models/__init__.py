"""Models: building and loading VLM directories, the SFT and GRPO LightningModules, metrics."""
