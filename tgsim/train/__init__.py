"""Training: configs, the step loop, optimizers, schedules, checkpoints and results directories."""
