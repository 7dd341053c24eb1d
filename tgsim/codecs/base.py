"""The codec protocol: what every gradient codec in tgsim declares and provides.

Like tensor_encoding's stages, a codec states its properties, and one shared test base
(tests/codec_contract.py) checks them for every codec: round trip, header validation,
unbiasedness (or the declared bias), exact error against Monte Carlo, bits counted from the payload.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence, runtime_checkable

from tgsim.errors import NonFiniteGradientError  # noqa: F401  (re-exported)
from tgsim.rng import StreamKey


@runtime_checkable
class Codec(Protocol):
    name: str

    @property
    def unbiased(self) -> bool: ...                 # E[decode(encode(g))] == g

    @property
    def allreduce_compatible(self) -> bool: ...     # codes of workers sum exactly (shared scaler)

    def encode(self, layers: Mapping, key: StreamKey, shared_scalers=None): ...

    def decode(self, message) -> dict: ...

    def aggregate(self, messages: Sequence, divide_by: int | None = None) -> dict: ...

    def bits_per_element(self, n: int, workers: int) -> dict: ...

    def exact_error(self, g) -> float: ...          # E||Q(g) - g||^2 where a formula exists
