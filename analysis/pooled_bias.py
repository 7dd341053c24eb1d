"""A pooled test of unbiasedness with a stated power: small biases add up over coordinates.

The per-coordinate exact tests (analysis.unbiasedness) see a bias only where one coordinate's mean
moves by several of its standard errors; a 1 % bias of every coordinate does not, at any practical
number of draws. This test projects each decoded draw Q_r(g) on a few fixed directions u_d and tests
the projections' means:

    p_rd = <Q_r(g), u_d>,   E p_rd = <g, u_d> under unbiasedness (linearity of expectation),
    z_d = (mean_r p_rd - <g, u_d>) / (sd_r(p_rd) / sqrt(R)),
    reject when max_d |z_d| > z_{1 - alpha / (2 D)}   (two-sided, Bonferroni over the D directions).

Each p_rd is a sum over all n coordinates, independent across draws, so z_d is close to normal
whatever one coordinate's law. Directions (`directions(g)`):

    "g"            u = g: weighs large coordinates (where clipping bites);
    "sign(g)"      u = sign(g): every coordinate alike (a uniform multiplicative bias);
    "sign(g), small |g|"   u = sign(g) 1{|g_i| <= q_25(|g|)}: the smallest quarter only (where a
                   resolution floor or an underflow bites).

Power. Against a relative bias delta in direction d (E p_d = (1 + delta) <g, u_d>) the test rejects
with probability >= `power` when

    |delta| >= delta_min,d = (z_{1 - alpha/(2D)} + z_power) · sd_d / (sqrt(R) · |<g, u_d>|),

(normal approximation, the other tail neglected). `PooledBiasResult.min_detectable` states it for
each direction, from the observed sd; tests/test_pooled_bias.py checks it by simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

ALPHA = 1e-3
POWER = 0.99
SMALL_QUANTILE = 0.25

__all__ = ["ALPHA", "POWER", "PooledBiasResult", "decoded_draws", "deterministic_draw", "directions",
           "draws_needed", "pooled_bias_test", "project_draws"]


def directions(g) -> dict[str, np.ndarray]:
    """The test's directions u_d for the target vector g (float64, flattened)."""
    g = np.asarray(g, dtype=np.float64).reshape(-1)
    s = np.sign(g)
    small = np.abs(g) <= np.quantile(np.abs(g), SMALL_QUANTILE)
    return {"g": g, "sign(g)": s, "sign(g), small |g|": s * small}


@dataclass(frozen=True)
class PooledBiasResult:
    names: tuple[str, ...]
    target: np.ndarray            # <g, u_d>
    relative_bias: np.ndarray     # mean_r p_rd / <g, u_d> - 1 (the estimate)
    z: np.ndarray
    min_detectable: np.ndarray    # delta_min,d: relative bias detected with probability `power`
    critical: float               # z_{1 - alpha / (2 D)}
    alpha: float
    power: float
    draws: int
    reject: bool

    def table(self) -> str:
        """One line per direction: estimate, z, and the smallest bias this run detects."""
        lines = [f"pooled z-test, alpha = {self.alpha:g} (Bonferroni over {len(self.names)}), R = {self.draws}, "
                 f"reject if |z| > {self.critical:.2f}: {'REJECT' if self.reject else 'accept'}"]
        for i, name in enumerate(self.names):
            lines.append(f"  {name:<20} bias {self.relative_bias[i]:+.2e}  z {self.z[i]:+6.2f}  "
                         f"detects |bias| >= {self.min_detectable[i]:.2e} with power {self.power:g}")
        return "\n".join(lines)


def _critical(alpha: float, d: int) -> float:
    return float(norm.ppf(1.0 - alpha / (2 * d)))


def pooled_bias_test(projections, target, names=None, alpha: float = ALPHA, power: float = POWER) -> PooledBiasResult:
    """The test on projections (R, D) of R draws on D directions with expectations `target` (D,)."""
    p = np.asarray(projections, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    r, d = p.shape
    if r < 2:
        raise ValueError(f"the pooled test needs at least 2 draws, got {r}")
    names = tuple(names) if names is not None else tuple(f"u{i}" for i in range(d))
    se = p.std(axis=0, ddof=1) / math.sqrt(r)
    crit = _critical(alpha, d)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, (p.mean(axis=0) - target) / se, np.where(p.mean(axis=0) == target, 0.0, np.inf))
        rel = np.where(target != 0, p.mean(axis=0) / target - 1.0, np.nan)
        dmin = np.where(target != 0, (crit + norm.ppf(power)) * se / np.abs(target), np.inf)
    return PooledBiasResult(names, target, rel, z, dmin, crit, alpha, power, r, bool(np.any(np.abs(z) > crit)))


def draws_needed(sd, target, delta: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """Smallest R at which every direction's delta_min <= delta, from per-draw sds of a pilot."""
    sd = np.asarray(sd, dtype=np.float64)
    target = np.abs(np.asarray(target, dtype=np.float64))
    k = (_critical(alpha, sd.size) + norm.ppf(power)) / delta
    return int(math.ceil(float(np.max((k * sd / target) ** 2))))


def project_draws(decode_draws, g, draws: int, chunk: int = 32) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(projections (R, D), targets (D,), names) of `draws` decoded draws of g on `directions(g)`.

    decode_draws(first, count) -> (count, n) array: the decoded draws first..first+count-1 (each with
    its own stream key), asked for in chunks of `chunk` so that memory stays count x n."""
    u = directions(g)
    names = tuple(u)
    dirs = np.stack([u[k] for k in names])
    out = np.empty((draws, len(names)))
    for first in range(0, draws, chunk):
        count = min(chunk, draws - first)
        v = np.asarray(decode_draws(first, count), dtype=np.float64).reshape(count, -1)
        out[first:first + count] = v @ dirs.T
    return out, dirs @ np.asarray(g, dtype=np.float64).reshape(-1), names


def decoded_draws(codec, g, first: int, count: int, seed: int) -> np.ndarray:
    """(count, n) float64: draws first..first+count-1 of a codec's decoded Q(g), draw r being worker
    r of one `encode_many` of copies of g (each worker its own stream key, step 0), with the shared
    statistics the codec declares (all copies alike, so the MAX is every worker's own)."""
    g = np.asarray(g)
    layers = {"g": np.repeat(g[None], count, axis=0)}
    stats = codec.prepare_many(layers)
    shared = None
    if codec.properties.shared_stats == "max":
        shared = codec.local_scalers_many(stats, count).max(axis=0)
    msgs = codec.encode_many(layers, seed, 0, np.arange(first, first + count), shared, stats)
    return np.stack([np.asarray(codec.decode(m)["g"], np.float64).reshape(-1) for m in msgs])


def deterministic_draw(codec, g, seed: int) -> np.ndarray | None:
    """The one decoded Q(g) of a deterministic codec (three draws with different keys alike), else
    None: such codecs are compared exactly, not by a test of means."""
    first = decoded_draws(codec, g, 0, 3, seed)
    return first[0] if (first == first[0]).all() else None
