"""Every error tgsim raises on purpose, in one module that every layer imports (nothing imported here).

    ConfigError               a config that cannot run: bad key, value or combination (exit status 2)
    NonFiniteGradientError    a gradient holds NaN/Inf: names the layer (the step is skipped or the run stops;
                              `tgsim run` prints it in one line and exits 2, its last good state checkpointed)
    PayloadError              a malformed, truncated or mismatched payload: names what and where
    CollectiveError           marker: raised with the same message on every MPI rank (none left waiting)
    RankConfigMismatchError   ranks started with different configs, versions or shard plans
    PeerPayloadError          a payload received from another rank is malformed (names the sender)
    ServerError               the parameter server (rank 0) failed for another reason
    RunDirError               a directory that is not a tgsim run (or sweep), or runs that cannot be shown
                              together (`tgsim plot`: exit status 2)

All but the marker are ValueError / RuntimeError subclasses, so `except ValueError` keeps working.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot run; the message names the key or the combination."""


class NonFiniteGradientError(ValueError):
    """A gradient holds NaN or Inf; names the layer so the step can be skipped or the run stopped."""

    def __init__(self, layer: str, count: int | None = None, where: str = "", advice: str = ""):
        self.layer, self.count, self.where, self.advice = layer, count, where, advice
        what = f"{count} non-finite values" if count is not None else "non-finite values"
        at = f" at {where}" if where else ""
        more = f"; {advice}" if advice else ""
        super().__init__(f"layer {layer!r}: gradient has {what} (NaN/Inf){at}; refusing to encode{more}")

    def __reduce__(self):
        """Pickle by the constructor's arguments, so the error crosses a process pool unchanged."""
        return type(self), (self.layer, self.count, self.where, self.advice)


def nonfinite_elsewhere(step: int, what: str = "gradient") -> ValueError:
    """The error of a process whose own workers' gradients are finite at `step` while another process's
    are not (over MPI; that process raises NonFiniteGradientError naming the layer and worker): a plain
    ValueError marked `nonfinite = True`, so the trainer can checkpoint and stop on every rank alike."""
    return nonfinite_error(f"step {step}: another worker's {what} is non-finite (see its error)")


def nonfinite_error(message: str) -> ValueError:
    """A ValueError with `message`, marked `nonfinite = True` (`is_nonfinite`)."""
    err = ValueError(message)
    err.nonfinite = True
    return err


def is_nonfinite(err: BaseException) -> bool:
    """Whether `err` stopped a step for a non-finite gradient (this process's or another's)."""
    return isinstance(err, NonFiniteGradientError) or bool(getattr(err, "nonfinite", False))


class PayloadError(ValueError):
    """A payload (message bytes, downlink, packed codes) is malformed, truncated or mismatched."""


class CollectiveError(Exception):
    """Marker: this error is raised with the same message on every rank (no rank is left waiting)."""


class RankConfigMismatchError(ConfigError, CollectiveError):
    """Ranks were started with different configs (or codec / library versions, or shard plans)."""


class PeerPayloadError(PayloadError, CollectiveError):
    """A payload received from another rank is malformed; the message names the sender rank."""


class ServerError(RuntimeError, CollectiveError):
    """The parameter server (rank 0) failed for another reason; every rank raises it."""


class RunDirError(ValueError):
    """A directory that is not a tgsim run or sweep, or runs that cannot be overlaid (different models);
    the message names the directory and what is missing or differs."""
