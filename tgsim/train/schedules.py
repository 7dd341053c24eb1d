"""Learning-rate schedules γ_t as plain functions of the step t (0-based)."""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("constant", "step", "poly", "robbins_monro")


@dataclass(frozen=True)
class ScheduleConfig:
    name: str = "constant"
    lr: float = 0.1          # γ0
    every: int = 1000        # step: multiply by gamma every `every` steps
    gamma: float = 0.1
    power: float = 1.0       # poly: γ0 (1 - t/T)^power, T = total steps
    tau: float = 100.0       # robbins_monro: γ0 / (1 + t/τ)  (Σγ = ∞, Σγ² < ∞: Assumption 2)
    end_lr: float = 0.0      # poly: floor


def learning_rate(cfg: ScheduleConfig, step: int, total_steps: int) -> float:
    """γ_t of the schedule `cfg` at step t = `step` (0-based) of a run of `total_steps` steps:
    constant γ0, step γ0 gamma^(t // every), poly end + (γ0 - end)(1 - t/T)^power, robbins_monro
    γ0 / (1 + t/τ); ValueError for an unknown name."""
    if cfg.name == "constant":
        return cfg.lr
    if cfg.name == "step":
        return cfg.lr * cfg.gamma ** (step // cfg.every)
    if cfg.name == "poly":
        frac = min(step / max(total_steps, 1), 1.0)
        return cfg.end_lr + (cfg.lr - cfg.end_lr) * (1.0 - frac) ** cfg.power
    if cfg.name == "robbins_monro":
        return cfg.lr / (1.0 + step / cfg.tau)
    raise ValueError(f"unknown schedule {cfg.name!r}; expected one of {SCHEDULES}")
