"""TensorBoard event files of a run, written while it goes: the scalars of its metrics.csv.

`[run] tensorboard = true` writes them into RUN_DIR/tensorboard, `tgsim run --tensorboard DIR` (and
`tgsim.mpi_runs.train --tensorboard DIR`) into DIR: `tensorboard --logdir DIR`. Over MPI rank 0
writes them, with rank 0's counts, as it writes metrics.csv. The writer is the tensorboard
package's own (its EventFileWriter and event protos; `pip install 'tgsim[tensorboard]'`): a run
that asks for event files without it stops before anything is written (ConfigError).

Each metrics.csv row (tgsim.train.results.MetricsWriter) becomes one event at its step, one value
per finite number in it, as the CSV holds it (`row_scalars`):

    train/loss, train/bits_up, train/bits_down, train/lr, train/skipped, train/dist_opt,
    train/seconds                          the model row of each step (bits per worker, that step)
    test/loss, test/accuracy               an evaluation (validation/... with a validation split)
    <stat>/<layer>                         the per-layer rows: scaler, inf_l1, l2sq, clip_fraction,
                                           scaler_ratio, noise_to_signal, zero_grad_fraction

so TensorBoard groups the layers of one statistic together. Values are float32, as TensorBoard
stores them. A resumed run first writes a restart marker at the step it resumes after (a START
session log at that step + 1), so TensorBoard, as tgsim's metrics.csv does, drops the killed run's
later points.

The DDP hook keeps no metrics.csv: `HookLog` writes the hook state's counts after each step
(`train/bits_up`, `train/bits_down` of that step, `train/skipped`) and the loss and learning rate the
training script passes, at the hook's step count.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from tgsim.errors import ConfigError

MODEL_COLUMNS = ("loss", "bits_up", "bits_down", "lr", "skipped", "dist_opt", "seconds")
EVAL_COLUMNS = ("loss", "accuracy")
LAYER_COLUMNS = ("scaler", "inf_l1", "l2sq", "clip_fraction", "scaler_ratio", "noise_to_signal", "zero_grad_fraction")
SUBDIR = "tensorboard"          # [run] tensorboard = true: the event files' folder inside the run directory
FLUSH_SECS = 10                 # the writer's flush period (and at each checkpoint and the run's end)


def require() -> None:
    """ConfigError, naming the extra to install, when the tensorboard package cannot be imported."""
    try:
        import tensorboard.summary.writer.event_file_writer  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"TensorBoard event files need the tensorboard package ({e}): pip install "
                          "'tgsim[tensorboard]'") from None


def log_dir(enabled: bool, out: Path, override: str | Path | None) -> Path | None:
    """The folder of a run's event files: `override` (--tensorboard DIR) where given, else
    `out`/tensorboard where `enabled` ([run] tensorboard), else None (none written)."""
    if override is not None:
        return Path(override)
    return Path(out) / SUBDIR if enabled else None


def _number(v) -> float | None:
    """`v` (a number, or metrics.csv's text of one) as a float, or None where it is not a finite
    number."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def row_scalars(row: dict) -> dict[str, float]:
    """{tag: value} of one metrics.csv row (a dict with step, split, layer and its numbers; module
    docstring): the finite numbers only."""
    split, layer = row.get("split"), row.get("layer")
    if layer not in (None, "model"):
        pairs = ((f"{c}/{layer}", row.get(c)) for c in LAYER_COLUMNS)
    elif split == "train":
        pairs = ((f"train/{c}", row.get(c)) for c in MODEL_COLUMNS)
    else:
        pairs = ((f"{split}/{c}", row.get(c)) for c in EVAL_COLUMNS)
    return {tag: f for tag, v in pairs if (f := _number(v)) is not None}


class EventLog:
    """The event files of one run in `logdir` (created): `scalars(step, values)`, `row(metrics_row)`,
    `flush()`, `close()`. purge_step: the first step a resumed run writes again; earlier files' events
    from it on are dropped by TensorBoard's readers."""

    def __init__(self, logdir: str | Path, purge_step: int | None = None):
        require()
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._Event, self._Summary = Event, Summary
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._w = EventFileWriter(str(self.logdir), flush_secs=FLUSH_SECS)
        if purge_step is not None:
            self._w.add_event(Event(step=int(purge_step), wall_time=time.time(),
                                    session_log=SessionLog(status=SessionLog.START)))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """One event at `step` holding each {tag: value} of `values` (as float32)."""
        if not values:
            return
        summary = self._Summary(value=[self._Summary.Value(tag=t, simple_value=float(v)) for t, v in values.items()])
        self._w.add_event(self._Event(step=int(step), wall_time=time.time(), summary=summary))

    def row(self, row: dict) -> None:
        """The scalars of one metrics.csv row (`row_scalars`) at its step."""
        self.scalars(int(row["step"]), row_scalars(row))

    def flush(self) -> None:
        self._w.flush()

    def close(self) -> None:
        self._w.close()


class HookLog:
    """Event files of a DDP training script (tgsim.torch.ddp): after each optimizer step, `step(state,
    loss=..., lr=...)` writes the hook state's counts of the step just exchanged at the state's step
    count (1-based, as metrics.csv): train/bits_up and train/bits_down (8 x the bytes this rank sent and
    received in that step), train/skipped, and `loss` and `lr` where given. Make it after the state
    (and its `load_state_dict`, on a resume), on one rank: the counts start from the state's."""

    def __init__(self, logdir: str | Path, state):
        self.events = EventLog(logdir, purge_step=int(state.step) + 1 if state.step else None)
        self._sent, self._received = float(state.sent), float(state.received)

    def step(self, state, loss: float | None = None, lr: float | None = None) -> dict[str, float]:
        """Write the step `state` (a TgsimHookState: step, sent, received, skipped) last exchanged; returns
        the values written."""
        sent, received = float(state.sent), float(state.received)
        up, down = sent - self._sent, received - self._received
        self._sent, self._received = sent, received
        values = {"train/bits_up": 8 * up, "train/bits_down": 8 * down, "train/skipped": float(bool(state.skipped))}
        for tag, v in (("train/loss", loss), ("train/lr", lr)):
            if (f := _number(v)) is not None:
                values[tag] = f
        self.events.scalars(int(state.step), values)
        return values

    def close(self) -> None:
        self.events.close()
