"""Sign codecs, 1 bit per element up: signSGD with majority vote ("sign") and the scaled sign
("scaled_sign"). Both deterministic, so biased (properties.unbiased = False).

sign: signSGD with majority vote (Bernstein et al. 2018, 2019)
    Q(g)_i = -1 if g_i < 0, else +1         (one bit cannot say 0: sign(0) = sign(-0.0) = +1 here)
    aggregate = sign(Σ_w Q(g_w)_i) in {-1, 0, +1}, float32; 0 on a tie, which an even N allows
    (properties.combine = "majority": no 1/N, `divide_by` is not used)
  Uplink: 1 bit per element. Downlink: the vote takes three values, so a server sending it needs
  2 bits per element (a sign plane and a nonzero plane); `bits_per_element` counts those 2 bits.
  tgsim's "ps" exchange for "own"-wire codecs broadcasts the aggregate as float32 today (32 bits per
  element, which is what its byte counts show); a codec-made downlink would need an exchange hook.

scaled_sign: (||g||_1 / n) sign(g) per layer (analysis.peers.scaled_sign)
    c = f32(||g||_1 / n)   (0 for an empty layer),  Q(g)_i = c·sign(g_i),  sign(0) = 0
    ||g||_1 = Σ_i f64|g_i| in a fixed order (`l1_norm`: 65536 lanes, then a halving tree), so its
    bits do not depend on the worker count, the process or the array library
    aggregate = f32(Σ_w f64(Q(g_w)) · (1/N)), workers in order (properties.combine = "mean")
  Its error is ||Q(g) - g||^2 = ||g||^2 - 2c||g||_1 + c^2 nnz(g) (analysis.peers.scaled_sign_error,
  there with c in float64; = ||g||^2 - ||g||_1^2 / n when g has no zero). To decode sign(0) = 0, a
  layer with zero elements also sends a nonzero plane: 1 bit per element for a layer without zeros,
  2 bits for a layer with some, none for a layer that is all zero (c = 0).

Both work on f32(g) (other dtypes are cast first) and hold the planes in NumPy or CuPy like `g`.

Kernels ([codec] kernels): "auto" and "numba" encode NumPy gradients and decode-sum the messages with
the Numba kernels of tgsim.codecs.numba_sign (one pass per row: the planes, and scaled_sign's lanes
of the l1 norm; the vote or the float32 mean straight from the packed planes), the same bytes and
float32 bits as this array code; "reference" and "cuda" run the array code (CuPy gradients always
do; "numba" refuses them).

Wire: the frame of tgsim.codecs.framing, then a body (little-endian; a plane is one bit per element,
element j at bit j % 8 of byte j // 8 (np.packbits, bitorder "little"), each layer's plane padded
with zero bits to whole bytes, ceil(n_l / 8) bytes):
    sign         magic b"TGS1", version 1; per layer the sign plane (bit 1: g < 0)
                 bytes = HEADER.size + Σ_l ceil(n_l / 8)
    scaled_sign  magic b"TGC1", version 1; c of every layer (float32), then planes_l of every layer
                 (u8: 0 = c is 0, nothing follows; 1 = sign plane; 2 = sign plane, then nonzero plane
                 (bit 1: g != 0), sign bits 0 where g == 0), then each layer's planes
                 bytes = HEADER.size + 5 L + Σ_l planes_l · ceil(n_l / 8)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tgsim.backend import array_module
from tgsim.codecs import options
from tgsim.codecs.base import CodecProperties, PlainCodec, layer_shapes, per_element_bits
from tgsim.codecs.fp32 import first_nonfinite
from tgsim.codecs.framing import HEADER, frame, unframe
from tgsim.codecs.ordered_mean import ordered_mean
from tgsim.errors import PayloadError

_SIGN_MAGIC, _SCALED_MAGIC, _VERSION = b"TGS1", b"TGC1", 1
KERNELS = ("auto", "reference", "numba", "cuda")
LANES = 65536             # the lanes of the scale's float64 sum (l1_norm)


def _host(a) -> np.ndarray:
    """A NumPy copy of a CuPy array (`.get()`), or the NumPy array itself."""
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def _plane_bytes(n: int) -> int:
    return (n + 7) // 8


def _pack_rows(bits):
    """(W, n) bool -> (W, ceil(n/8)) uint8, each row packed on its own (bit order little)."""
    xp = array_module(bits)
    w, n = bits.shape
    nb = _plane_bytes(n)
    padded = xp.zeros((w, 8 * nb), dtype=xp.bool_)     # rows padded to whole bytes: CuPy's packbits has no axis
    padded[:, :n] = bits
    return xp.packbits(padded.reshape(-1), bitorder="little").reshape(w, nb)


# bit j of a byte (bit order little) -> row j of a table: one np.take per plane decodes 8 elements a byte
_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")   # (256, 8) 0/1
_PLUS_MINUS = (1 - 2 * _BITS.astype(np.int8)).astype(np.float32)                          # bit 1 -> -1.0


def _expand(plane, table, n: int):
    """The first n entries of table[byte] over the plane's bytes, flat (NumPy or CuPy like `plane`)."""
    xp = array_module(plane)
    return xp.take(xp.asarray(table), plane, axis=0).reshape(-1)[:n]


def _as_rows(g):
    """Layer (W, *shape) -> float32 (W, n)."""
    xp = array_module(g)
    return xp.asarray(g, dtype=xp.float32).reshape(g.shape[0], -1)


def l1_norm(v) -> float:
    """Σ_i f64|v_i| of the flat float32 row v in a fixed order, so that NumPy, CuPy and any thread count
    give the same bits: lane j sums the i ≡ j (mod LANES) in ascending i, then the halving tree a <-
    a[:h] + a[h:2h] over the lanes (as tgsim.codecs.terngrad.moments). A row of n <= LANES uses the
    power of two >= n as its width: the lanes it leaves out hold 0, which the tree adds exactly."""
    xp = array_module(v)
    n = int(v.size)
    if n == 0:
        return 0.0
    width = min(LANES, 1 << (n - 1).bit_length())
    acc = xp.zeros(width, dtype=xp.float64)
    rows, rem = divmod(n, width)
    for r in range(rows):
        acc += xp.abs(v[r * width:(r + 1) * width])
    if rem:
        acc[:rem] += xp.abs(v[rows * width:])
    h = width // 2
    while h >= 1:
        acc = acc[:h] + acc[h:2 * h]
        h //= 2
    return float(acc[0])


def _shapes_sizes(shapes: Mapping):
    return [(k, tuple(s), int(np.prod(s, dtype=np.int64))) for k, s in shapes.items()]


def _plane_from(body: memoryview, off: int, n: int, what: str, layer: str) -> np.ndarray:
    """The plane of n bits at body[off:], its padding bits checked to be zero."""
    plane = np.frombuffer(body, dtype=np.uint8, count=_plane_bytes(n), offset=off).copy()
    if n % 8 and int(plane[-1]) >> (n % 8):
        raise PayloadError(f"{what}: layer {layer!r}: padding bits after its {n} elements are not zero")
    return plane


def _check_nonfinite(layers: Mapping) -> None:
    err = first_nonfinite(layers)
    if err is not None:
        raise err


class _Kernels(PlainCodec):
    """The `kernels` option the two sign codecs share; neither has options of its own."""

    @dataclass(frozen=True)
    class Options:
        """No [codec] keys besides name, kernels and error_feedback."""

    def __init__(self, kernels: str = "auto"):
        if kernels not in KERNELS:
            raise ValueError(f"unknown kernels {kernels!r}; expected one of {KERNELS}")
        self.kernels = kernels

    @classmethod
    def from_config(cls, cfg):
        """The codec of a [codec] section: no options (tgsim.codecs.options.parse checks) and `kernels`."""
        options.parse(cls, cfg)
        return cls(kernels=getattr(cfg, "kernels", "auto"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()" if self.kernels == "auto" else \
            f"{type(self).__name__}(kernels={self.kernels!r})"

    def _numba(self, on_host: bool) -> bool:
        """Whether the Numba kernels run: kernels "auto"/"numba" on NumPy arrays."""
        if self.kernels == "numba" and not on_host:
            raise ValueError("the Numba kernels run on NumPy arrays; use kernels='cuda' or 'auto' for CuPy arrays")
        return on_host and self.kernels in ("auto", "numba")


# ---------------------------------------------------------------------------------------------
# sign: signSGD with majority vote
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SignMessage:
    shapes: dict          # name -> the layer's shape
    signs: dict           # name -> packed sign plane, uint8 (ceil(n/8),); bit 1: the element is < 0

    def to_bytes(self) -> bytes:
        return frame(_SIGN_MAGIC, _VERSION, self.shapes, b"".join(_host(p).tobytes() for p in self.signs.values()))

    @property
    def wire_bytes(self) -> int:
        return HEADER.size + sum(int(p.size) for p in self.signs.values())


class SignSGD(_Kernels):
    """signSGD with majority vote (registered as "sign"): 1 bit per element, the server's vote."""

    name = "sign"
    properties = CodecProperties(unbiased=False, wire="own", combine="majority")

    def prepare_many(self, layers: Mapping) -> None:
        """NonFiniteGradientError for a NaN/Inf gradient (first worker first); no statistics."""
        _check_nonfinite(layers)
        return None

    def encode_many(self, layers: Mapping, seed: int, step: int, workers, shared_scalers=None, stats=None,
                    **_) -> list[SignMessage]:
        """One message per local worker: the packed sign bits of its layers (one pass per layer)."""
        packed = {}
        for k, g in layers.items():
            if self._numba(isinstance(g, np.ndarray)):
                from tgsim.codecs import numba_sign

                packed[k] = numba_sign.sign_planes(g)
            else:
                packed[k] = _pack_rows(_as_rows(g) < 0)
        shapes = {k: tuple(g.shape[1:]) for k, g in layers.items()}
        return [SignMessage(shapes, {k: p[i] for k, p in packed.items()}) for i in range(len(workers))]

    def from_bytes(self, buf, like: SignMessage) -> SignMessage:
        """The message in `buf`, checked against the receiver's layers `like` (PayloadError names what)."""
        what = "sign message"
        body = unframe(buf, _SIGN_MAGIC, _VERSION, like.shapes, what)
        layers = _shapes_sizes(like.shapes)
        need = sum(_plane_bytes(n) for _, _, n in layers)
        if len(body) != need:
            raise PayloadError(f"{what} body is {len(body)} bytes, the layers need {need}")
        signs, off = {}, 0
        for k, _, n in layers:
            signs[k] = _plane_from(body, off, n, what, k)
            off += _plane_bytes(n)
        return SignMessage(dict(like.shapes), signs)

    def decode(self, message: SignMessage) -> dict:
        """±1.0 float32 per element (+1 for g >= 0, -1 for g < 0)."""
        return {k: _expand(message.signs[k], _PLUS_MINUS, int(np.prod(s, dtype=np.int64))).reshape(s)
                for k, s in message.shapes.items()}

    def aggregate(self, messages: Sequence[SignMessage], divide_by: int | None = None) -> dict:
        """The majority vote sign(Σ_w decode_w) per element, float32 in {-1, 0, +1} (0 on a tie);
        exact integer counts, so the order of the messages does not matter. `divide_by` is unused."""
        n_msgs = len(messages)
        if n_msgs and self._numba(all(isinstance(p, np.ndarray) for p in messages[0].signs.values())):
            from tgsim.codecs import numba_sign

            return {k: numba_sign.majority_vote([m.signs[k] for m in messages],
                                                int(np.prod(s, dtype=np.int64))).reshape(s)
                    for k, s in messages[0].shapes.items()}
        count = np.uint8 if n_msgs < 2**8 else np.uint16 if n_msgs < 2**16 else np.uint32
        out = {}
        for k, s in messages[0].shapes.items():
            n = int(np.prod(s, dtype=np.int64))
            xp = array_module(messages[0].signs[k])
            negatives = xp.zeros(n, dtype=count)
            for m in messages:
                negatives += xp.unpackbits(m.signs[k], bitorder="little")[:n]
            vote = (negatives < (n_msgs + 1) // 2).astype(xp.float32)    # +1 where 2·negatives < N
            vote -= negatives > n_msgs // 2                                  # -1 where 2·negatives > N
            out[k] = vote.reshape(s)
        return out

    def bits_per_element(self, layers_or_shapes: Mapping) -> float:
        """8 (HEADER + Σ_l ceil(n_l / 8)) / Σ_l n_l: the frame's header and one sign plane a layer."""
        sizes = [int(np.prod(s, dtype=np.int64)) for s in layer_shapes(layers_or_shapes).values()]
        return per_element_bits(HEADER.size + sum(_plane_bytes(n) for n in sizes), layers_or_shapes)

    def link_bits(self, n: int, workers: int) -> dict:
        """Up: ceil(n/8) bytes of signs + the header, over n; down: 2 bits, the vote in {-1, 0, +1}
        (what a signSGD server needs; tgsim's ps exchange sends the float32 aggregate, 32 bits)."""
        return {"up": 8 * (HEADER.size + _plane_bytes(n)) / n if n else 0.0, "down": 2}


# ---------------------------------------------------------------------------------------------
# scaled_sign: (||g||_1 / n) sign(g) per layer
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScaledSignMessage:
    shapes: dict          # name -> the layer's shape
    scales: np.ndarray    # (L,) float32: c of each layer
    planes: np.ndarray    # (L,) uint8: 0 (c = 0), 1 (sign plane), 2 (sign and nonzero planes)
    signs: dict           # name -> packed sign plane, uint8 (bit 1: g < 0), or None (planes 0)
    nonzero: dict         # name -> packed nonzero plane, uint8 (bit 1: g != 0), or None (planes 0, 1)

    def to_bytes(self) -> bytes:
        parts = [np.asarray(self.scales, dtype="<f4").tobytes(), np.asarray(self.planes, dtype=np.uint8).tobytes()]
        for k in self.shapes:
            for p in (self.signs[k], self.nonzero[k]):
                if p is not None:
                    parts.append(_host(p).tobytes())
        return frame(_SCALED_MAGIC, _VERSION, self.shapes, b"".join(parts))

    @property
    def wire_bytes(self) -> int:
        planes = sum(int(p.size) for d in (self.signs, self.nonzero) for p in d.values() if p is not None)
        return HEADER.size + 5 * len(self.shapes) + planes


class ScaledSign(_Kernels):
    """The scaled sign (registered as "scaled_sign"): one float32 per layer + 1 bit per element
    (2 for a layer with zero elements)."""

    name = "scaled_sign"
    properties = CodecProperties(unbiased=False, wire="own", combine="mean")

    @dataclass(frozen=True)
    class Options:
        """No [codec] keys besides name, kernels and error_feedback."""

        compare_with_error_feedback = True    # tgsim compare runs it with error feedback (biased, memoryless)

    def prepare_many(self, layers: Mapping) -> None:
        """NonFiniteGradientError for a NaN/Inf gradient (first worker first); no shared statistics."""
        _check_nonfinite(layers)
        return None

    def encode_many(self, layers: Mapping, seed: int, step: int, workers, shared_scalers=None, stats=None,
                    **_) -> list[ScaledSignMessage]:
        """One message per local worker; c is summed per worker (the same bits whatever W is)."""
        n_w = len(workers)
        shapes = {k: tuple(g.shape[1:]) for k, g in layers.items()}
        scales = np.zeros((n_w, len(layers)), np.float32)
        planes = np.zeros((n_w, len(layers)), np.uint8)
        signs = [{} for _ in range(n_w)]
        nonzero = [{} for _ in range(n_w)]
        for j, (k, g) in enumerate(layers.items()):
            if self._numba(isinstance(g, np.ndarray)) and g[0].size:
                from tgsim.codecs import numba_sign

                cs, dense, neg, nz = numba_sign.scaled_planes(g)
                for i in range(n_w):
                    scales[i, j] = cs[i]
                    planes[i, j] = 0 if cs[i] == 0 else (1 if dense[i] else 2)
                    signs[i][k] = neg[i] if planes[i, j] else None
                    nonzero[i][k] = nz[i] if planes[i, j] == 2 else None
                continue
            rows = _as_rows(g)
            n = rows.shape[1]
            neg = _pack_rows(rows < 0)
            nz_bits = rows != 0
            dense = _host(nz_bits.all(axis=1))
            nz = None if dense.all() else _pack_rows(nz_bits)
            for i in range(n_w):
                c = np.float32(l1_norm(rows[i]) / n) if n else np.float32(0)
                scales[i, j] = c
                planes[i, j] = 0 if c == 0 else (1 if dense[i] else 2)
                signs[i][k] = neg[i] if planes[i, j] else None
                nonzero[i][k] = nz[i] if planes[i, j] == 2 else None
        return [ScaledSignMessage(shapes, scales[i], planes[i], signs[i], nonzero[i]) for i in range(n_w)]

    def from_bytes(self, buf, like: ScaledSignMessage) -> ScaledSignMessage:
        """The message in `buf`, checked against the receiver's layers `like` (PayloadError names what)."""
        what = "scaled_sign message"
        body = unframe(buf, _SCALED_MAGIC, _VERSION, like.shapes, what)
        layers = _shapes_sizes(like.shapes)
        n_l = len(layers)
        if len(body) < 5 * n_l:
            raise PayloadError(f"{what} body is {len(body)} bytes, shorter than its {n_l} scales and plane counts")
        scales = np.frombuffer(body, dtype="<f4", count=n_l).astype(np.float32)
        planes = np.frombuffer(body, dtype=np.uint8, count=n_l, offset=4 * n_l).copy()
        for (k, _, n), c, p in zip(layers, scales, planes):
            if p > 2:
                raise PayloadError(f"{what}: layer {k!r}: {p} bit planes (0, 1 or 2 are valid)")
            if not np.isfinite(c) or np.signbit(c):
                raise PayloadError(f"{what}: layer {k!r}: scale {c!r} is not a finite value >= +0")
            if (c == 0) != (p == 0) or (n == 0 and p):
                raise PayloadError(f"{what}: layer {k!r}: scale {c!r} with {p} bit planes for {n} elements")
        need = 5 * n_l + sum(int(p) * _plane_bytes(n) for (_, _, n), p in zip(layers, planes))
        if len(body) != need:
            raise PayloadError(f"{what} body is {len(body)} bytes, its layers and plane counts need {need}")
        signs, nonzero, off = {}, {}, 5 * n_l
        for (k, _, n), p in zip(layers, planes):
            signs[k] = nonzero[k] = None
            if p >= 1:
                signs[k] = _plane_from(body, off, n, what, k)
                off += _plane_bytes(n)
            if p == 2:
                nonzero[k] = _plane_from(body, off, n, what, k)
                off += _plane_bytes(n)
                if np.any(signs[k] & ~nonzero[k]):
                    raise PayloadError(f"{what}: layer {k!r}: a sign bit is set on a zero element")
        return ScaledSignMessage(dict(like.shapes), scales, planes, signs, nonzero)

    def decode(self, message: ScaledSignMessage) -> dict:
        """c·sign(g) per element, float32: ±c, and 0 where g == 0 (or everywhere when c = 0)."""
        out = {}
        for j, (k, s) in enumerate(message.shapes.items()):
            n = int(np.prod(s, dtype=np.int64))
            sg = message.signs[k]
            if sg is None:
                out[k] = np.zeros(s, np.float32)
                continue
            v = _expand(sg, _PLUS_MINUS * message.scales[j], n)        # ±c: exact, c·(±1)
            if message.nonzero[k] is not None:
                xp = array_module(message.nonzero[k])
                v *= xp.unpackbits(message.nonzero[k], bitorder="little")[:n]   # +0 where g == 0 (sign bit 0)
            out[k] = v.reshape(s)
        return out

    def aggregate(self, messages: Sequence[ScaledSignMessage], divide_by: int | None = None) -> dict:
        divide_by = len(messages) if divide_by is None else divide_by
        host = messages and all(isinstance(p, np.ndarray) for m in messages[:1] for d in (m.signs, m.nonzero)
                                for p in d.values() if p is not None)
        if host and self._numba(True):
            from tgsim.codecs import numba_sign

            out = {}
            for j, (k, s) in enumerate(messages[0].shapes.items()):
                out[k] = numba_sign.scaled_mean([m.signs[k] for m in messages], [m.nonzero[k] for m in messages],
                                                [int(m.planes[j]) for m in messages],
                                                [m.scales[j] for m in messages], int(np.prod(s, dtype=np.int64)),
                                                divide_by).reshape(s)
            return out
        return ordered_mean([self.decode(m) for m in messages], len(messages) if divide_by is None else divide_by)

    bits_exact = False       # a layer sends 0, 1 or 2 planes (all zero, no zero, some zeros)

    def bits_per_element(self, layers_or_shapes: Mapping) -> float:
        """The largest message: 8 (HEADER + 5 L + Σ_l 2 ceil(n_l / 8)) / Σ_l n_l (the header, each
        layer's scale and plane count, a sign and a nonzero plane per layer; a layer without zeros
        sends one plane, an all-zero layer none)."""
        sizes = [int(np.prod(s, dtype=np.int64)) for s in layer_shapes(layers_or_shapes).values()]
        return per_element_bits(HEADER.size + 5 * len(sizes) + sum(2 * _plane_bytes(n) for n in sizes),
                                layers_or_shapes)

    def link_bits(self, n: int, workers: int, with_zeros: bool = False) -> dict:
        """Up, for one layer of n elements: the header, its scale and plane count, and one plane
        (no zero element) or two (`with_zeros`), over n; down: the server's float32 mean. (analysis.
        peers.bits_per_element counts 1 + 32/n: no frame, and zeros sent as if they were free.)"""
        planes = 2 if with_zeros else 1
        return {"up": 8 * (HEADER.size + 5 + planes * _plane_bytes(n)) / n if n else 0.0, "down": 32}
