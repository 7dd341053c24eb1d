"""Every error tgsim raises on purpose, in one module that every layer imports (nothing imported here).

    ConfigError               a config that cannot run: bad key, value or combination (exit status 2)
    NonFiniteGradientError    a gradient holds NaN/Inf: names the layer (the step is skipped or the run stops)
    PayloadError              a malformed, truncated or mismatched payload: names what and where
    CollectiveError           marker: raised with the same message on every MPI rank (none left waiting)
    RankConfigMismatchError   ranks started with different configs, versions or shard plans
    PeerPayloadError          a payload received from another rank is malformed (names the sender)
    ServerError               the parameter server (rank 0) failed for another reason

All but the marker are ValueError / RuntimeError subclasses, so `except ValueError` keeps working.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot run; the message names the key or the combination."""


class NonFiniteGradientError(ValueError):
    """A gradient holds NaN or Inf; names the layer so the step can be skipped or the run stopped."""

    def __init__(self, layer: str, count: int | None = None, where: str = ""):
        self.layer, self.count, self.where = layer, count, where
        what = f"{count} non-finite values" if count is not None else "non-finite values"
        at = f" at {where}" if where else ""
        super().__init__(f"layer {layer!r}: gradient has {what} (NaN/Inf){at}; refusing to encode")

    def __reduce__(self):
        """Pickle by the constructor's arguments, so the error crosses a process pool unchanged."""
        return type(self), (self.layer, self.count, self.where)


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
