"""The exchange protocol: how workers agree on scalers and combine their gradients.

The trainer holds the gradients of its *local* workers (all N in the simulator, one per MPI rank)
and never knows which implementation it has. Every implementation returns, on every worker, the
same aggregate bits for the same inputs; only the transport differs.

Modes (docs/THEORY.md §1, "Exchange in the paper"):
  allreduce  fp32: ring all-reduce of the float gradients. Packed codes (sums_exactly): shared scaler,
             ring all-reduce of the integer codes (int8 for N <= 127, else int16), decoded s/N · Σ codes.
  ps         parameter server with parameter localization: workers push packed codes, the server
             sums them and sends back Σ codes bit-packed at ceil(log2(2N+1)) bits (shared scaler) or
             the float32 mean (no sharing); optionally the server ternarizes the mean again.
  allgather  every worker receives every packed message and decodes each with its own scaler.
  sharded_ps every worker is the server of one contiguous shard of the ternary codes (shared scaler):
             shard r's packed codes go to worker r, which returns Σ codes bit-packed at
             ceil(log2(2N+1)) bits to all (tgsim/exchange/sharded.py, its bytes per worker).
Bytes are counted per worker from the payloads that cross the wire: `sent` and `received`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from tgsim.codecs import packing


@dataclass
class CommBytes:
    """Bytes one worker sent and received in one step (averaged over workers where they differ)."""

    sent: float = 0.0
    received: float = 0.0

    def __iadd__(self, other: "CommBytes") -> "CommBytes":
        self.sent += other.sent
        self.received += other.received
        return self


def mean_of_scalers(rows: np.ndarray, n: int) -> np.ndarray:
    """float32 (L,): f32((Σ_w f64(rows[w])) · (1/n)), the rows (every worker's float32 scalers, in
    worker order) added one at a time; the simulator and every MPI rank compute it alike."""
    acc = np.zeros(rows.shape[1], dtype=np.float64)
    for r in np.asarray(rows, dtype=np.float32):
        acc += r.astype(np.float64)
    return (acc * np.float64(1.0 / n)).astype(np.float32)


def own_downlink_bytes(mean: dict, combine: str = "mean") -> int:
    """Bytes of a parameter server's answer to codecs with their own messages: the float32 mean, or
    for combine = "majority" the vote in {-1, 0, +1} packed 2 bits an element (tgsim.codecs.packing),
    all layers in one run."""
    n = sum(int(np.size(v)) for v in mean.values())
    return packing.packed_size(n, "2bit") if combine == "majority" else 4 * n


def own_wire_bytes(wire: int, mean: dict, mode: str, workers: int, combine: str = "mean") -> "CommBytes":
    """Bytes of one worker for a codec with its own messages (wire bytes each): all-gather sends and
    receives N-1 messages; a parameter server takes one and returns `own_downlink_bytes`."""
    if mode == "allgather":
        return CommBytes((workers - 1) * wire, (workers - 1) * wire)
    if mode == "ps":
        return CommBytes(wire, own_downlink_bytes(mean, combine))
    raise ValueError(f"mode {mode!r} needs a codec whose codes sum exactly (its messages travel whole)")


def ring_allreduce_bytes(nbytes: int, workers: int) -> float:
    """Bytes each worker sends (and receives) in a ring all-reduce: 2 (N-1)/N · size."""
    return 2.0 * (workers - 1) / workers * nbytes if workers > 1 else 0.0


class Exchange(Protocol):
    n_workers: int
    local_workers: tuple[int, ...]

    def max_scalers(self, local: np.ndarray) -> np.ndarray:
        """(n_local, L) local scalers -> (L,) maximum over all workers (MAX all-reduce)."""

    def mean_scalers(self, local: np.ndarray) -> np.ndarray:
        """(n_local, L) local scalers -> (L,) mean over all workers, `mean_of_scalers` of all rows."""

    def mean_fp32(self, local_layers: Sequence[dict]) -> tuple[dict, CommBytes]:
        """Mean over all workers of float32 layers: f32(Σ_w f64(g_w), ascending w, · 1/N)."""

    def aggregate(self, codec, local_messages: Sequence, mode: str, shared: bool,
                  reternarize_key=None) -> tuple[dict, CommBytes]:
        """Mean over all workers of the decoded messages, by the strategy the codec's declared
        capabilities (float_mean, sums_exactly) and `mode` select (tgsim.codecs.base.CodecProperties)."""

    def any_true(self, flag: bool) -> bool:
        """True on every worker if `flag` is true on any worker (e.g. a non-finite gradient)."""

    def mean_scalar(self, local_sum: float) -> float:
        """(Σ over all workers of a per-worker scalar) / N, given this process's local sum."""

    def check_same_config(self, digest: str, shard_plan: str | None = None) -> None:
        """Raise on every worker if any worker was started with a different config or shard plan."""

    def gather_rows(self, local: np.ndarray, root: int = 0) -> np.ndarray | None:
        """(n_local, M) rows of this process's workers -> (N, M) rows of all workers in worker order on
        `root` (the process that writes checkpoints), None elsewhere (error feedback's residuals)."""
