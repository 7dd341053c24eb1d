"""Suresh et al. 2017 ("Distributed Mean Estimation with Limited Communication", ICML): stochastic
k-level quantization between a layer's min and max (their π_sk), optionally after a randomized
Hadamard rotation (their π_srk, `rotate = true`).

k = `levels` (config [codec] levels, 2 <= k <= 2^16): k levels counting both ends, so k = 2 is
their stochastic binary quantizer and each element costs b = ceil(log2 k) bits (the default
levels = 7 sends 3 bits and leaves one code unused; levels = 8 fills them).

Per worker and layer (flattened, C order, n elements), in float64:

    y      = v                                   (rotate = false; m = n values are quantized)
    y      = R v' = H D v' / sqrt(d)             (rotate = true; m = d values): v' = v padded with
             zeros to d = 2^ceil(log2 n), H the d x d Sylvester-Hadamard matrix (scipy.linalg.
             hadamard's order; `fwht`), D = diag(1 - 2 (word_j & 1)) with word_j the words
             [2^33, 2^33 + d) of the layer's stream StreamKey(seed, step, worker, layer index)
             (disjoint from the rounding's words [0, d))
    lo, hi = min y, max y rounded outward to float32 (down, up): the two float32 values sent, so
             lo <= y_i <= hi whatever the gradient's dtype
    Δ      = (f64(hi) - f64(lo)) / (k - 1)       the level spacing; B(r) = r·Δ + f64(lo), r = 0..k-1
    x_i    = (y_i - f64(lo)) / Δ                 in [0, k - 1]; 0 where Δ = 0 (a constant layer)
    l_i    = min(floor(x_i + u_i), k - 1)        u_i = tgsim.rng.uniform(m, StreamKey(seed, step,
                                                 worker, layer index)): 24-bit uniforms
    decode = f32(B(l))                           (rotate = false)
    decode = f32((D H B(l) / sqrt(d))[:n])       (rotate = true: R^T = D H / sqrt(d), H symmetric)

(x_i + u_i < k for x_i <= k - 1 up to float64 rounding, so the min only guards that rounding.)

Unbiasedness: l_i is floor(x_i) + 1 with probability floor(f_i 2^24) / 2^24, f_i = x_i - floor(x_i)
(tgsim.rng.uniform's grid), so E B(l_i) = y_i - δ_i Δ, 0 <= δ_i < 2^-24: unbiased up to the 24-bit
resolution every tgsim codec has (docs/THEORY.md §1), plus the float32 rounding of the decode.
With rotation E R^T B(l) = R^T y = v' (up to float64 rounding), and its first n entries are v.

Error of one draw (exact, given the rotation; analysis.peers.suresh_error):

    E||Q(v) - v||^2 = Σ_{i<m} (y_i - B(r_i)) (B(r_i + 1) - y_i) = Δ^2 Σ_i f_i (1 - f_i),  r_i = floor(x_i)

without rotation; with rotation the coordinates of B(l) - y are independent given D and every
entry of R is ±1/sqrt(d), so each decoded coordinate has variance (1/d) Σ_j σ_j^2 and the n kept
ones have (n/d) times the sum above over the d rotated values. Bounds (one vector, Suresh et al.):
Theorem 2, <= m/(4 (k-1)^2) (hi - lo)^2 <= m/(2 (k-1)^2) ||v||^2; Theorem 3 (rotated), <= (2 ln d
+ 2)/(k-1)^2 ||v||^2 in expectation over D.

Array code, NumPy or CuPy (`array_module` of the gradient): the rotation, the fast Walsh-Hadamard
transform (log2 d butterfly passes on a reshaped array) and the quantization; on the host the
stream's words of layers from 256 elements come from the Numba Philox (the same words, bit for bit;
the array reference's per-call cost dominated the training step of small models).
Messages hold host (NumPy) arrays; packing is tgsim.codecs.packing.pack_uint.

Kernels ([codec] kernels): "auto" and "numba" encode NumPy gradients and decode-sum the messages
with the Numba kernels of tgsim.codecs.numba_suresh (range, then levels and packed bits in one
task-parallel pass; the rotation and its inverse; the mean without a float64 decode of each
message), the same bytes and float32 bits as this array code; "reference" and "cuda" run the array
code (CuPy gradients always do; "numba" refuses them).

    mean = f32(Σ_w f64(decode_w) · (1/N)), workers in order (tgsim.codecs.ordered_mean)

Wire: its own bytes, exchanged whole (properties.wire = "own"): the frame of tgsim.codecs.framing
(magic b"TGU1", version 1), then, little-endian:

    k u32 | rotate u8
    rotate only: seed u64 | step u32 | worker u32      the stream key the receiver rebuilds D from
    per layer, in order (nothing for an empty layer):
        lo float32 | hi float32
        ceil(m b / 8) bytes            the levels l_i, b bits each, little-endian bit order
                                       (pack_uint), zero-padded

from_bytes refuses (PayloadError naming the layer): other parameters than the receiver's, a lo or hi
that is not finite or lo > hi, a level above k - 1, a non-zero level where lo = hi, wrong lengths,
non-zero padding, bytes after the last layer.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tgsim.backend import array_module, to_numpy
from tgsim.codecs import options
from tgsim.codecs.base import CodecProperties, encode_one, layer_ids, layer_shapes, per_element_bits
from tgsim.codecs.fp32 import first_beyond_float32, first_nonfinite
from tgsim.codecs.framing import HEADER, frame, unframe
from tgsim.codecs.ordered_mean import ordered_mean
from tgsim.codecs.packing import pack_uint, unpack_uint
from tgsim.errors import PayloadError
from tgsim.rng import StreamKey, random_words

_MAGIC, _VERSION = b"TGU1", 1
PARAMS = struct.Struct("<IB")
KEY = struct.Struct("<QII")
RANGE = struct.Struct("<ff")
MIN_LEVELS, MAX_LEVELS = 2, 2**16
KERNELS = ("auto", "reference", "numba", "cuda")
SIGN_OFFSET = 2**33                   # the rotation's signs: words [2^33, 2^33 + d) of the layer's stream
F32_MAX = float(np.finfo(np.float32).max)
_NUMBA_WORDS_FROM = 1 << 8            # words from which the host takes them from the Numba Philox
                                      # (docs/MEASUREMENTS.md)


def code_bits(k: int) -> int:
    """b = ceil(log2 k): the bits of a level in [0, k - 1]."""
    return (int(k) - 1).bit_length()


def padded_size(n: int) -> int:
    """d = 2^ceil(log2 n): the rotated length of a layer of n elements (0 for n = 0)."""
    return 0 if n == 0 else 1 << (int(n) - 1).bit_length()


def _words(n: int, key: StreamKey, xp, start: int = 0):
    """tgsim.rng.random_words(n, key, xp, start); on the host from 256 words the Numba Philox's."""
    if xp is np and n >= _NUMBA_WORDS_FROM:
        from tgsim.rng.numba_philox import random_words as numba_words

        return numba_words(n, key, start)
    return random_words(n, key, xp, start)


def fwht(x):
    """H x along the last axis (length d, a power of two), H the unnormalized Sylvester-Hadamard
    matrix H_{2h} = [[H_h, H_h], [H_h, -H_h]] (scipy.linalg.hadamard): log2 d butterfly passes, each
    on x viewed as (..., d / 2h, 2, h). A new float64 array; NumPy or CuPy."""
    xp = array_module(x)
    y = xp.array(x, dtype=xp.float64, copy=True)
    d = int(y.shape[-1]) if y.ndim else 1
    if d & (d - 1):
        raise ValueError(f"fwht needs a power-of-two length, got {d}")
    lead = y.shape[:-1]
    tmp = xp.empty(lead + (d // 2,), dtype=xp.float64)
    h = 1
    while h < d:
        v = y.reshape(lead + (d // (2 * h), 2, h))
        t = tmp.reshape(lead + (d // (2 * h), h))
        # short rows (h < 16) one column at a time: the same operations, but long 1-D loops
        for a, b, c in (((v[..., 0, j], v[..., 1, j], t[..., j]) for j in range(h)) if h < 16 else
                        ((v[..., 0, :], v[..., 1, :], t),)):
            xp.subtract(a, b, out=c)
            a += b
            b[...] = c
        h *= 2
    return y


def _signs(d: int, key: StreamKey, xp):
    """D's diagonal, float64 ±1: 1 - 2 (word & 1) of the words [SIGN_OFFSET, SIGN_OFFSET + d)."""
    bit = (_words(d, key, xp, SIGN_OFFSET) & xp.uint32(1)).astype(xp.float64)
    return 1.0 - 2.0 * bit


def rotate(v, key: StreamKey):
    """y = H D v' / sqrt(d), float64 (d,), v' = v (flat) zero-padded to d = padded_size(n), D's random
    signs from the stream `key`."""
    xp = array_module(v)
    v = v.reshape(-1)
    n = int(v.size)
    d = padded_size(n)
    x = xp.zeros(d, dtype=xp.float64)
    x[:n] = v
    x *= _signs(d, key, xp)
    y = fwht(x)
    y *= 1.0 / math.sqrt(d) if d else 1.0
    return y


def unrotate(y, key: StreamKey, n: int):
    """The first n entries of R^T y = D H y / sqrt(d), float64 (y: (d,)), D's signs from the stream `key`
    (rotate undone)."""
    xp = array_module(y)
    d = int(y.size)
    x = fwht(y)
    x *= 1.0 / math.sqrt(d) if d else 1.0
    x *= _signs(d, key, xp)
    return x[:n]


def outward_range(y) -> tuple[np.float32, np.float32]:
    """(lo, hi): min y rounded down and max y rounded up to float32 (y float64, non-empty)."""
    lo64, hi64 = float(y.min()), float(y.max())
    if max(-lo64, hi64) > F32_MAX:
        raise ValueError(f"suresh sends float32 ranges: value {max(-lo64, hi64):.4g} is beyond float32's range")
    lo, hi = np.float32(lo64), np.float32(hi64)
    if float(lo) > lo64:
        lo = np.nextafter(lo, np.float32(-np.inf))
    if float(hi) < hi64:
        hi = np.nextafter(hi, np.float32(np.inf))
    return lo + np.float32(0.0), hi + np.float32(0.0)          # -0.0 -> +0.0


def spacing(lo, hi, k: int) -> float:
    """Δ = (f64(hi) - f64(lo)) / (k - 1): the level spacing encoder and decoder use."""
    return (float(hi) - float(lo)) / (k - 1)


def quantize(y, key: StreamKey, k: int):
    """(lo, hi, levels) of the float64 values y (flat, NumPy or CuPy, non-empty) for k levels, the
    rounding draws from the stream `key`: levels uint8 for k <= 256, else uint16, in [0, k - 1]."""
    xp = array_module(y)
    lo, hi = outward_range(y)
    step = spacing(lo, hi, k)
    m = int(y.size)
    dtype = xp.uint8 if k <= 256 else xp.uint16
    if step == 0.0:
        return lo, hi, xp.zeros(m, dtype=dtype)
    x = y - float(lo)
    x /= step
    x += (_words(m, key, xp) >> xp.uint32(8)).astype(xp.float64) * xp.float64(2.0 ** -24)
    xp.floor(x, out=x)
    xp.minimum(x, k - 1, out=x)
    return lo, hi, x.astype(dtype)


def dequantize(lo, hi, levels, k: int):
    """B(l) = l·Δ + f64(lo), float64 (NumPy or CuPy like levels), with Δ = spacing(lo, hi, k) of the
    range [lo, hi] and k levels."""
    xp = array_module(levels)
    out = levels.astype(xp.float64)
    out *= spacing(lo, hi, k)
    out += float(lo)
    return out


@dataclass(frozen=True)
class SureshMessage:
    params: tuple         # (k, rotate), as on the wire
    key: tuple | None     # (seed, step, worker) where rotate, else None
    shapes: dict          # name -> layer shape
    ranges: dict          # name -> float32 (2,) [lo, hi] ((0,) for an empty layer)
    levels: dict          # name -> levels (m,), uint8 or uint16
    payload: dict         # name -> uint8 payload bytes
    ids: tuple | None = None   # the layers' stream-key indices in `shapes` order (None: 0, 1, ...); not on the wire

    def to_bytes(self) -> bytes:
        parts = [PARAMS.pack(*self.params)]
        if self.key is not None:
            parts.append(KEY.pack(*self.key))
        for k in self.shapes:
            parts.append(np.ascontiguousarray(self.ranges[k], dtype="<f4").tobytes())
            parts.append(np.ascontiguousarray(self.payload[k], dtype=np.uint8).tobytes())
        return frame(_MAGIC, _VERSION, self.shapes, b"".join(parts))

    @property
    def wire_bytes(self) -> int:
        return (HEADER.size + PARAMS.size + (KEY.size if self.key is not None else 0)
                + sum(4 * int(self.ranges[k].size) + int(self.payload[k].size) for k in self.shapes))


def _ids(message: SureshMessage) -> list[int]:
    """The stream-key layer index of each layer of `message`, in its order."""
    return list(range(len(message.shapes))) if message.ids is None else list(message.ids)


class Suresh:
    """Stochastic k-level quantization (k = `levels`), optionally rotated (registered as "suresh")."""

    name = "suresh"
    properties = CodecProperties(unbiased=True, wire="own", combine="mean")

    @dataclass(frozen=True)
    class Options:
        """The [codec] keys of suresh (defaults: k = 7 levels, no rotation)."""

        levels: int = options.option(7, "k: quantization levels between the layer's min and max, both ends included",
                                     min=MIN_LEVELS, max=MAX_LEVELS, sweep=(2, 4, 8, 16, 256, 65536))
        rotate: bool = options.option(False, "randomized Hadamard rotation seeded from the stream key")

    def __init__(self, levels: int = 7, rotate: bool = False, kernels: str = "auto"):
        if not isinstance(levels, (int, np.integer)) or isinstance(levels, bool) \
                or not MIN_LEVELS <= levels <= MAX_LEVELS:
            raise ValueError(f"suresh levels (k, both ends included) must be an integer in [{MIN_LEVELS}, "
                             f"{MAX_LEVELS}], got {levels!r}")
        if not isinstance(rotate, (bool, np.bool_)):
            raise ValueError(f"suresh rotate must be true or false, got {rotate!r}")
        if kernels not in KERNELS:
            raise ValueError(f"unknown kernels {kernels!r}; expected one of {KERNELS}")
        self.levels, self.rotate, self.kernels = int(levels), bool(rotate), kernels
        self._params = (self.levels, int(self.rotate))

    @classmethod
    def from_config(cls, cfg):
        """The codec of a [codec] section: its Options (tgsim.codecs.options.parse) and `kernels`."""
        o = options.parse(cls, cfg)
        return cls(levels=o.levels, rotate=o.rotate, kernels=getattr(cfg, "kernels", "auto"))

    def __repr__(self) -> str:
        extra = "" if self.kernels == "auto" else f", kernels={self.kernels!r}"
        return f"Suresh(levels={self.levels}, rotate={self.rotate}{extra})"

    def _numba(self, on_host: bool) -> bool:
        """Whether the Numba kernels run: kernels "auto"/"numba" on NumPy arrays."""
        if self.kernels == "numba" and not on_host:
            raise ValueError("the Numba kernels run on NumPy arrays; use kernels='cuda' or 'auto' for CuPy arrays")
        return on_host and self.kernels in ("auto", "numba")

    def _encode_numba(self, v: np.ndarray, key: StreamKey):
        """(lo, hi, levels, payload) of one worker's non-empty NumPy layer v by the Numba kernels."""
        from tgsim.codecs import numba_suresh

        n = int(v.size)
        if self.rotate:
            d = padded_size(n)
            y = numba_suresh.rotate(v, key, d, 1.0 / math.sqrt(d))
        else:
            y = np.ascontiguousarray(v).reshape(-1)
            if y.dtype not in (np.float32, np.float64):
                y = y.astype(np.float32)                   # float16 and others: exact in float32
        lo, hi = outward_range(y)
        step = spacing(lo, hi, self.levels)
        if step == 0.0:
            q = np.zeros(int(y.size), np.uint8 if self.levels <= 256 else np.uint16)
            return lo, hi, q, np.zeros(-(-int(y.size) * code_bits(self.levels) // 8), np.uint8)
        q, payload = numba_suresh.levels_and_payload(y, key, self.levels, float(lo), step)
        return lo, hi, q, payload

    def local_scalers_many(self, stats, workers: int | None = None):
        raise TypeError("suresh shares no statistics (properties.shared_stats is None)")

    def quantized_size(self, n: int) -> int:
        """m: the values quantized for a layer of n elements (d = padded_size(n) when rotating)."""
        return padded_size(n) if self.rotate else int(n)

    # -- encode ---------------------------------------------------------------------------------
    def prepare_many(self, layers: Mapping) -> None:
        """NonFiniteGradientError for a NaN/Inf gradient (first worker first); ValueError for a value
        beyond float32's range (float64 gradients only), naming the layer and the worker."""
        err = first_nonfinite(layers)
        if err is not None:
            raise err
        err = first_beyond_float32(layers, "suresh sends float32 ranges")
        if err is not None:
            raise err
        return None

    def transform(self, v, key: StreamKey):
        """y: the float64 values quantized for one worker's layer v (rotated where `rotate`)."""
        xp = array_module(v)
        return rotate(v, key) if self.rotate else v.reshape(-1).astype(xp.float64)

    def encode(self, layers: Mapping, key, shared_scalers=None):
        """One worker's message of its layers {name: array} under StreamKey `key`
        (tgsim.codecs.base.encode_one: the worker's row of `encode_many`)."""
        return encode_one(self, layers, key, shared_scalers)

    def encode_many(self, layers: Mapping, seed: int, step: int, workers, shared_scalers=None, stats=None,
                    **_) -> list[SureshMessage]:
        """One message per local worker; layer i of worker workers[w] draws from StreamKey(seed, step,
        workers[w], i) (rounding: words [0, m); rotation signs: words [2^33, 2^33 + d)), i = the layer's
        index `layer_ids(layers)`, which the message keeps (`ids`) for the rotation's inverse."""
        shapes = {k: tuple(g.shape[1:]) for k, g in layers.items()}
        b = code_bits(self.levels)
        ids = layer_ids(layers)
        kept = None if ids == list(range(len(ids))) else tuple(ids)
        msgs = []
        for i, worker in enumerate(workers):
            ranges, levels, payload = {}, {}, {}
            for li, (k, g) in zip(ids, layers.items()):
                key = StreamKey(int(seed), int(step), int(worker), li)
                if g[i].size == 0:
                    ranges[k], levels[k] = np.zeros(0, np.float32), np.zeros(0, np.uint8)
                elif self._numba(isinstance(g, np.ndarray)):
                    try:
                        lo, hi, levels[k], payload[k] = self._encode_numba(g[i], key)
                    except ValueError as e:
                        raise ValueError(f"layer {k!r} of worker {int(worker)}: {e}") from None
                    ranges[k] = np.array([lo, hi], np.float32)
                    continue
                else:
                    try:
                        lo, hi, q = quantize(self.transform(g[i], key), key, self.levels)
                    except ValueError as e:
                        raise ValueError(f"layer {k!r} of worker {int(worker)}: {e}") from None
                    ranges[k], levels[k] = np.array([lo, hi], np.float32), to_numpy(q)
                payload[k] = pack_uint(levels[k], b)
            key = (int(seed), int(step), int(worker)) if self.rotate else None
            msgs.append(SureshMessage(self._params, key, shapes, ranges, levels, payload, kept))
        return msgs

    # -- bytes ----------------------------------------------------------------------------------
    def from_bytes(self, buf, like: SureshMessage) -> SureshMessage:
        """The message in `buf`, checked against the receiver's layers `like` and this codec's
        parameters (PayloadError names what is wrong and where)."""
        shapes = dict(like.shapes)
        body = unframe(buf, _MAGIC, _VERSION, shapes, "suresh message")
        if len(body) < PARAMS.size:
            raise PayloadError(f"suresh message body is {len(body)} bytes, shorter than its parameters")
        got = PARAMS.unpack_from(body)
        if got != self._params:
            raise PayloadError(f"suresh message has levels={got[0]}, rotate={got[1]}; this codec has "
                               f"levels={self._params[0]}, rotate={self._params[1]}")
        off = PARAMS.size
        key = None
        if self.rotate:
            if len(body) < off + KEY.size:
                raise PayloadError("suresh message truncated inside its stream key")
            key = KEY.unpack_from(body, off)
            off += KEY.size
        k, b = self.levels, code_bits(self.levels)
        ranges, levels, payload = {}, {}, {}
        for name, shape in shapes.items():
            n = int(np.prod(shape, dtype=np.int64))
            what = f"suresh message, layer {name!r}"
            if n == 0:
                ranges[name], levels[name], payload[name] = np.zeros(0, np.float32), np.zeros(0, np.uint8), \
                    np.zeros(0, np.uint8)
                continue
            m = self.quantized_size(n)
            nbytes = -(-m * b // 8)
            need = RANGE.size + nbytes
            if off + need > len(body):
                raise PayloadError(f"{what}: truncated ({len(body) - off} bytes left, the layer needs {need})")
            rng = np.frombuffer(body, dtype="<f4", count=2, offset=off).astype(np.float32)
            off += RANGE.size
            if not np.isfinite(rng).all() or not rng[0] <= rng[1]:
                raise PayloadError(f"{what}: range [{float(rng[0])!r}, {float(rng[1])!r}] is not two finite "
                                   "float32 with lo <= hi")
            pay = np.frombuffer(body, dtype=np.uint8, count=nbytes, offset=off).copy()
            off += nbytes
            if (m * b) % 8 and int(pay[-1]) >> ((m * b) % 8):
                raise PayloadError(f"{what}: non-zero padding bits after bit {m * b}")
            q = unpack_uint(pay, m, b).astype(np.uint8 if k <= 256 else np.uint16)
            big = q > k - 1
            if big.any():
                i = int(np.argmax(big))
                raise PayloadError(f"{what}: element {i} has level {int(q[i])} > k - 1 = {k - 1}")
            if rng[0] == rng[1] and q.any():
                i = int(np.argmax(q != 0))
                raise PayloadError(f"{what}: element {i} has level {int(q[i])} where lo = hi")
            ranges[name], levels[name], payload[name] = rng, q, pay
        if off != len(body):
            raise PayloadError(f"suresh message: {len(body) - off} bytes after the last layer")
        return SureshMessage(got, key, shapes, ranges, levels, payload, like.ids)   # the receiver's layer indices

    # -- decode and combine -------------------------------------------------------------------
    def decode_layer(self, message: SureshMessage, name: str, index: int, xp=np):
        """One layer of the message, float32 flat (NumPy, or CuPy with xp = cupy)."""
        n = int(np.prod(message.shapes[name], dtype=np.int64))
        if n == 0:
            return xp.zeros(0, dtype=xp.float32)
        lo, hi = message.ranges[name]
        z = dequantize(lo, hi, xp.asarray(message.levels[name]), self.levels)
        if self.rotate:
            seed, step, worker = message.key
            z = unrotate(z, StreamKey(seed, step, worker, index), n)
        return z.astype(xp.float32)

    def decode(self, message: SureshMessage) -> dict:
        return {k: self.decode_layer(message, k, i).reshape(shape)
                for i, (k, shape) in zip(_ids(message), message.shapes.items())}

    def aggregate(self, messages: Sequence[SureshMessage], divide_by: int | None = None) -> dict:
        divide_by = len(messages) if divide_by is None else divide_by
        if messages and self._numba(True):
            from tgsim.codecs import numba_suresh

            out = {}
            for li, (k, shape) in zip(_ids(messages[0]), messages[0].shapes.items()):
                n = int(np.prod(shape, dtype=np.int64))
                keys, scale = None, 1.0
                if self.rotate and n:
                    keys = [StreamKey(*m.key, li) for m in messages]
                    scale = 1.0 / math.sqrt(padded_size(n))
                out[k] = numba_suresh.decode_sum([m.levels[k] for m in messages], [m.ranges[k] for m in messages],
                                                 self.levels, n, divide_by, keys, scale).reshape(shape)
            return out
        return ordered_mean([self.decode(m) for m in messages], divide_by)

    # -- bits -----------------------------------------------------------------------------------
    def bits_per_element(self, layers_or_shapes: Mapping) -> float:
        """8 (HEADER + PARAMS [+ KEY] + Σ_{n_l > 0} (8 + ceil(m_l b / 8))) / Σ_l n_l, exact: the frame's
        header, the parameters, the stream key where rotating, and per non-empty layer lo, hi and
        its m_l levels of b = ceil(log2 k) bits (m_l = n_l, or d = 2^ceil(log2 n_l) rotating)."""
        sizes = [int(np.prod(s, dtype=np.int64)) for s in layer_shapes(layers_or_shapes).values()]
        b = code_bits(self.levels)
        body = sum(RANGE.size + -(-self.quantized_size(n) * b // 8) for n in sizes if n)
        return per_element_bits(HEADER.size + PARAMS.size + (KEY.size if self.rotate else 0) + body, layers_or_shapes)

    def link_bits(self, n: int, workers: int) -> dict:
        """Bits per element of a one-layer message of n elements, exact (header, parameters, the
        stream key where rotating, lo and hi, padding included): 8 (HEADER + PARAMS [+ KEY] + 8 +
        ceil(m b / 8)) / n, m = n or d = 2^ceil(log2 n) (rotate), b = ceil(log2 k); "up" = "up_max".
        Downlink: the server's float32 mean (32)."""
        if n == 0:
            return {"up": 0.0, "up_max": 0.0, "down": 32}
        m = self.quantized_size(n)
        over = HEADER.size + PARAMS.size + (KEY.size if self.rotate else 0) + RANGE.size
        exact = 8 * (over + -(-m * code_bits(self.levels) // 8)) / n
        return {"up": exact, "up_max": exact, "down": 32}
