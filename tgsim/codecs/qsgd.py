"""QSGD (Alistarh et al. 2017, "QSGD: Communication-efficient SGD via gradient quantization and
encoding"): stochastic rounding of |v_i| / norm to s levels, per bucket, with the bucket's norm.

Per worker and layer (flattened, C order), in buckets of B = `bucket` consecutive elements (B = 0:
the whole layer; the last bucket is shorter when B does not divide n), with s = `levels`:

    norm_b = ||v_b||_2 ("l2", the paper's) or max_i |v_i| ("max"), over the bucket in float64
             (l2: NumPy's pairwise float64 sum of the squares, then sqrt), rounded UP to float32
             and saturated at float32's max: the value sent, and the one encoder and decoder use
    x_i    = (s · |v_i|) / norm_b                 float64, that order; 0 where norm_b = 0
    l_i    = floor(x_i + u_i)                     u_i = tgsim.rng.uniform(n, StreamKey(seed, step,
                                                  worker, layer index)): 24-bit uniforms
    v̂_i    = f32(sign(v_i) · (f64(norm_b) · l_i) / s)      +0 where l_i = 0

Why the norm is rounded up: the levels stay in [0, s] only if |v_i| <= norm_b for the norm both
sides use. For float32 gradients rounding to nearest would do (max|v_i| is then a float32, the
float64 squares are exact, and sums of non-negative terms, sqrt and rounding are monotone, so
fl(||v||_2) >= max|v_i| and its nearest float32 is too), but a float64 gradient's max|v_i| may lie
between two float32s, and round-to-nearest could then drop below it; rounding up (np.nextafter when
the nearest float32 is below the float64 norm) holds for every dtype and moves the norm by at most
one float32 ulp (2^-23 relative). The l2 norm of float32 values may exceed float32's range; it is
then sent as float32's max, still >= every |v_i| (values beyond float32's range are refused). With
|v_i| <= norm_b, x_i <= s (exactly for float16/float32 gradients, whose s·|v_i| is exact in float64;
within a float64 ulp of s for float64 ones), and x_i + u_i < s + 1 in float64 (u_i <= 1 - 2^-24,
s < 2^16), so l_i <= s without any clamp.

Unbiasedness, with respect to the sent norm: l_i = floor(x_i) + 1 exactly when u_i >= 1 - f_i
(f_i = x_i - floor(x_i), up to the float64 rounding of x_i + u_i), and u_i is uniform on the grid
k 2^-24, so P(l_i = floor(x_i) + 1) = floor(f_i 2^24) / 2^24: E[l_i] = x_i - δ_i, 0 <= δ_i < 2^-24,
and E[(norm_b · l_i) / s] = |v_i| - norm_b δ_i / s. The decoded values are also rounded to float32
(deterministically, at most 2^-24 of |v̂_i|). So E[v̂_i] = v_i up to norm_b · 2^-24 / s + 2^-24 |v̂|,
the 24-bit resolution TernGrad's rule has too (docs/THEORY.md §1); tests/test_peer_qsgd.py checks
this exactly from the draws' support and the uniform's grid. The error is E||v̂ - v||^2 =
Σ_b norm_b^2 / s^2 Σ_{i in b} f_i (1 - f_i) (analysis.peers.qsgd_error for one bucket)
<= min(B / s^2, sqrt(B) / s) ||v||^2 (Lemma 3.1).

Gradients of any float dtype are quantized from their float64 values (float16/float32 exactly).
Array code, NumPy or CuPy (`array_module`; the CuPy path is written but untested here); on the host
the uniforms of layers from 2^15 elements come from the Numba Philox (the same words), and the
Elias-gamma and paper coders are Numba (tgsim.codecs.elias says why). Messages hold host (NumPy)
arrays.

Kernels ([codec] kernels): "auto" and "numba" encode NumPy gradients and decode-sum the messages
with the fused Numba kernels of tgsim.codecs.numba_qsgd (norms, Philox words, levels and packed
bits in one pass over the layer; the mean without a float64 decode of each message), the same bytes
and float32 bits as this array code; "reference" and "cuda" run the array code (CuPy gradients
always do; "numba" refuses them).

    mean = f32(Σ_w f64(v̂_w) · (1/N)), workers in order (tgsim.codecs.ordered_mean)

Wire: its own bytes, exchanged whole (properties.wire = "own"): the frame of tgsim.codecs.framing
(magic b"TGQ1", version 1), then, little-endian:

    levels u32 | bucket u32 | norm u8 (0 "l2", 1 "max") | coding u8 (0 "fixed", 1 "elias", 2 "paper")
    per layer, in order:
        nbits u64                         "elias" and "paper" only: the layer's payload length in bits
        ceil(n / B) float32               the bucket norms (none for an empty layer)
        ceil(nbits / 8) bytes             the payload, bits most significant first, zero-padded
    "fixed": per element the w = 1 + b bit word (sign << b) | l_i, b = ceil(log2(s + 1)), sign = 1
             for v_i < 0 with l_i > 0 (0 otherwise): nbits = n w
    "elias": per element Elias-gamma(l_i + 1) then, for l_i > 0, the sign bit (tgsim.codecs.elias)
    "paper" (the default): Alistarh et al.'s §3.2 coding (tgsim.codecs.qsgd_paper_coding): per
             nonzero level, in index order, the Elias omega code of its gap from the previous
             nonzero (of its index + 1 for the first), its sign bit, the Elias omega code of |l_i|;
             zeros cost nothing but longer gaps

from_bytes refuses (PayloadError naming the layer): other parameters than the receiver's, a norm
that is not a finite non-negative float32 (-0 included), a level above s, a sign bit on level 0, a
non-zero level in a bucket of norm 0, bad Elias-gamma or Elias omega codes (a gap beyond the layer,
a level above s), wrong lengths, non-zero padding.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tgsim.backend import array_module, to_numpy
from tgsim.codecs import elias, options, qsgd_paper_coding as paper
from tgsim.codecs.base import CodecProperties, encode_one, layer_ids, layer_shapes, per_element_bits
from tgsim.codecs.fp32 import first_beyond_float32, first_nonfinite
from tgsim.codecs.framing import HEADER, frame, unframe
from tgsim.codecs.ordered_mean import ordered_mean
from tgsim.errors import PayloadError
from tgsim.rng import StreamKey, uniform

_MAGIC, _VERSION = b"TGQ1", 1
PARAMS = struct.Struct("<IIBB")
_NBITS = struct.Struct("<Q")
NORMS = ("l2", "max")
CODINGS = ("fixed", "elias", "paper")       # the wire's coding id is the index
DEFAULT_CODING = "paper"
MAX_LEVELS = 2**16 - 1
KERNELS = ("auto", "reference", "numba", "cuda")
F32_MAX = float(np.finfo(np.float32).max)
_NUMBA_UNIFORM_FROM = 1 << 15       # elements from which the uniforms come from the Numba Philox


def level_bits(s: int) -> int:
    """b = ceil(log2(s + 1)): the bits of a level in [0, s]."""
    return int(s).bit_length()


def bucket_count(n: int, bucket: int) -> int:
    """Buckets (norms) of a layer of n elements: ceil(n / bucket), 1 for bucket = 0 (0 if n = 0)."""
    if n == 0:
        return 0
    return 1 if bucket == 0 else -(-n // bucket)


def level_dtype(s: int):
    """The smallest signed integer dtype holding ±s."""
    return np.int8 if s <= 127 else np.int16 if s <= 32767 else np.int32


def _uniform(n: int, key: StreamKey, xp):
    """tgsim.rng.uniform(n, key, xp); on the host from 2^15 elements the same words from the Numba
    Philox (tgsim.rng.numba_philox, bit for bit the reference's)."""
    if xp is np and n >= _NUMBA_UNIFORM_FROM:
        from tgsim.rng.numba_philox import random_words

        return (random_words(n, key) >> np.uint32(8)).astype(np.float64) * np.float64(2.0 ** -24)
    return uniform(n, key, xp)


def bucket_norms(a, bucket: int, norm: str):
    """The float32 norms sent for |v| = a (float64, flat, NumPy or CuPy): the float64 l2 or max norm
    of each bucket, rounded up to float32, saturated at float32's max."""
    xp = array_module(a)
    n = int(a.size)
    B = bucket or n
    if n == 0:
        return xp.zeros(0, dtype=xp.float32)
    full = n // B
    parts = []
    for blk in ((a[:full * B].reshape(full, B),) if full else ()) + ((a[full * B:].reshape(1, -1),) if n % B else ()):
        parts.append(xp.sqrt((blk * blk).sum(axis=1)) if norm == "l2" else blk.max(axis=1))
    n64 = xp.minimum(xp.concatenate(parts), F32_MAX)
    n32 = n64.astype(xp.float32)
    low = n32.astype(xp.float64) < n64                # then n32 < float32's max
    n32[low] = xp.nextafter(n32[low], xp.float32(np.inf))
    return n32


def quantize(v, key: StreamKey, s: int, bucket: int, norm: str):
    """(norms float32 (buckets,), signed levels q (level_dtype(s), n)) of one worker's layer v: s levels,
    one norm per `bucket` elements (0: one bucket) of the `norm` ("l2" or "max"), rounding draws from
    the stream `key`."""
    xp = array_module(v)
    v = v.reshape(-1)
    n = int(v.size)
    a = v.astype(xp.float64)
    xp.abs(a, out=a)
    norms = bucket_norms(a, bucket, norm)
    if n == 0:
        return norms, xp.zeros(0, dtype=level_dtype(s))
    divisor = norms.astype(xp.float64)
    divisor[divisor == 0] = 1.0                # |v_i| = 0 throughout a bucket of norm 0
    x = a
    x *= s
    x /= xp.repeat(divisor, bucket or n)[:n]
    x += _uniform(n, key, xp)
    xp.floor(x, out=x)
    xp.copysign(x, v, out=x)                   # -l_i for v_i < 0 (-0.0 -> 0 for l_i = 0)
    return norms, x.astype(level_dtype(s))


def dequantize(norms, q, s: int, bucket: int):
    """v̂ = f32(sign · (f64(norm_b) · |q|) / s) of the levels q with the bucket `norms` (one per `bucket`
    elements), flat float32 (NumPy or CuPy like q)."""
    xp = array_module(q)
    n = int(q.size)
    if n == 0:
        return xp.zeros(0, dtype=xp.float32)
    mag = xp.repeat(norms.astype(xp.float64), bucket or n)[:n]
    mag *= xp.abs(q.astype(xp.float64))
    mag /= s
    return xp.where(q < 0, -mag, mag).astype(xp.float32)


def pack_fixed(q, s: int):
    """(payload uint8, nbits) of the signed levels q for s levels: the w = 1 + b bit words
    (sign << b) | |q_i|, most significant first. For w <= 8 eight words make w bytes (one uint64
    each); wider words go through a bit matrix."""
    xp = array_module(q)
    q = q.reshape(-1)
    n = int(q.size)
    b = level_bits(s)
    w = b + 1
    code = xp.abs(q.astype(xp.int64)).astype(xp.uint64) | ((q < 0).astype(xp.uint64) << xp.uint64(b))
    if w <= 8:
        m = -(-n // 8)
        c = xp.zeros(8 * m, dtype=xp.uint64)
        c[:n] = code
        c = c.reshape(m, 8)
        acc = xp.zeros(m, dtype=xp.uint64)
        for j in range(8):
            acc |= c[:, j] << xp.uint64(w * (7 - j))
        out = xp.empty((m, w), dtype=xp.uint8)
        for k in range(w):
            out[:, k] = (acc >> xp.uint64(8 * (w - 1 - k))) & xp.uint64(0xFF)
        return out.reshape(-1)[:-(-n * w // 8)], n * w
    shifts = xp.arange(w - 1, -1, -1, dtype=xp.uint64)
    bits = ((code[:, None] >> shifts) & xp.uint64(1)).astype(xp.uint8)
    return xp.packbits(bits.reshape(-1)), n * w


def unpack_fixed(buf, n: int, s: int, what: str = "qsgd payload"):
    """The n signed levels of pack_fixed's payload `buf` for s levels (PayloadError naming `what`: length,
    padding, level > s, a sign bit on level 0)."""
    xp = array_module(buf)
    b = level_bits(s)
    w = b + 1
    nbytes = -(-n * w // 8)
    if int(buf.size) != nbytes:
        raise PayloadError(f"{what}: {int(buf.size)} payload bytes, {n} elements of {w} bits need {nbytes}")
    if w <= 8:
        m = -(-n // 8)
        full = xp.zeros(m * w, dtype=xp.uint8)
        full[:nbytes] = buf
        full = full.reshape(m, w)
        acc = xp.zeros(m, dtype=xp.uint64)
        for k in range(w):
            acc |= full[:, k].astype(xp.uint64) << xp.uint64(8 * (w - 1 - k))
        c = xp.empty((m, 8), dtype=xp.uint8)
        for j in range(8):
            c[:, j] = (acc >> xp.uint64(w * (7 - j))) & xp.uint64((1 << w) - 1)
        c = c.reshape(-1)
        pad = c[n:]
    else:
        bits = xp.unpackbits(buf)
        pad = bits[n * w:]
        bits = bits[:n * w].reshape(n, w).astype(xp.uint32)
        c = xp.zeros(n, dtype=xp.uint32)
        for j in range(w):
            c |= bits[:, j] << xp.uint32(w - 1 - j)
    if bool(pad.any()):
        raise PayloadError(f"{what}: non-zero padding bits after bit {n * w}")
    c = c[:n]
    q = (c & c.dtype.type((1 << b) - 1)).astype(level_dtype(s))    # |level| < 2^b fits
    neg = (c >> c.dtype.type(b)) != 0
    big = q > s
    if bool(big.any()):
        i = int(xp.argmax(big))
        raise PayloadError(f"{what}: element {i} has level {int(q[i])} > s = {s}")
    bad = neg & (q == 0)
    if bool(bad.any()):
        raise PayloadError(f"{what}: element {int(xp.argmax(bad))} has level 0 with its sign bit set")
    return xp.where(neg, -q, q)


@dataclass(frozen=True)
class QSGDMessage:
    params: tuple         # (levels, bucket, norm code, coding code), as on the wire
    shapes: dict          # name -> layer shape
    norms: dict           # name -> float32 (buckets,)
    levels: dict          # name -> signed levels q (flat)
    payload: dict         # name -> uint8 payload bytes
    nbits: dict           # name -> payload length in bits

    def to_bytes(self) -> bytes:
        parts = [PARAMS.pack(*self.params)]
        counted = self.params[3] != 0                  # "elias" and "paper" send their bit length
        for k in self.shapes:
            if counted:
                parts.append(_NBITS.pack(self.nbits[k]))
            parts.append(np.ascontiguousarray(self.norms[k], dtype="<f4").tobytes())
            parts.append(np.ascontiguousarray(self.payload[k], dtype=np.uint8).tobytes())
        return frame(_MAGIC, _VERSION, self.shapes, b"".join(parts))

    @property
    def wire_bytes(self) -> int:
        per_layer = _NBITS.size if self.params[3] != 0 else 0
        return HEADER.size + PARAMS.size + sum(per_layer + 4 * int(self.norms[k].size) + int(self.payload[k].size)
                                               for k in self.shapes)


class QSGD:
    """QSGD with s = `levels` levels per bucket of `bucket` elements (registered as "qsgd")."""

    name = "qsgd"
    properties = CodecProperties(unbiased=True, wire="own", combine="mean")

    @dataclass(frozen=True)
    class Options:
        """The [codec] keys of qsgd (defaults: s = 7 levels, buckets of 512, the l2 norm)."""

        levels: int = options.option(7, "s: quantization levels of |v|/norm per bucket", min=1, max=MAX_LEVELS,
                                     sweep=(1, 3, 7, 31, 255, 1023, 4095, 32767))
        bucket: int = options.option(512, "elements per bucket, one norm each (0: the whole layer)", min=0,
                                     max=2**32 - 1, sweep=(0, 8192, 2048, 512, 128))
        norm: str = options.option("l2", "the bucket norm: l2 (Alistarh et al.) or max (max-norm variant)",
                                   choices=NORMS)
        coding: str = options.option(DEFAULT_CODING, "how the levels are written on the wire", choices=CODINGS,
                                     sweep=CODINGS)

    def __init__(self, levels: int = 7, bucket: int = 512, norm: str = "l2", coding: str = DEFAULT_CODING,
                 kernels: str = "auto"):
        def integer(v):
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        if not integer(levels) or not 1 <= levels <= MAX_LEVELS:
            raise ValueError(f"qsgd levels must be an integer in [1, {MAX_LEVELS}], got {levels!r}")
        if not integer(bucket) or not 0 <= bucket < 2**32:
            raise ValueError(f"qsgd bucket must be an integer in [0, 2^32) (0: the whole layer), got {bucket!r}")
        if norm not in NORMS:
            raise ValueError(f"qsgd norm must be one of {NORMS}, got {norm!r}")
        if coding not in CODINGS:
            raise ValueError(f"qsgd coding must be one of {CODINGS}, got {coding!r}")
        if kernels not in KERNELS:
            raise ValueError(f"unknown kernels {kernels!r}; expected one of {KERNELS}")
        self.levels, self.bucket, self.norm, self.coding = int(levels), int(bucket), norm, coding
        self.kernels = kernels
        self._params = (self.levels, self.bucket, NORMS.index(norm), CODINGS.index(coding))

    @classmethod
    def from_config(cls, cfg):
        """The codec of a [codec] section: its Options (tgsim.codecs.options.parse) and `kernels`."""
        o = options.parse(cls, cfg)
        return cls(levels=o.levels, bucket=o.bucket, norm=o.norm, coding=o.coding,
                   kernels=getattr(cfg, "kernels", "auto"))

    def __repr__(self) -> str:
        extra = "" if self.kernels == "auto" else f", kernels={self.kernels!r}"
        return (f"QSGD(levels={self.levels}, bucket={self.bucket}, norm={self.norm!r}, coding={self.coding!r}"
                f"{extra})")

    def _numba(self, on_host: bool) -> bool:
        """Whether the Numba kernels run: kernels "auto"/"numba" on NumPy arrays."""
        if self.kernels == "numba" and not on_host:
            raise ValueError("the Numba kernels run on NumPy arrays; use kernels='cuda' or 'auto' for CuPy arrays")
        return on_host and self.kernels in ("auto", "numba")

    def local_scalers_many(self, stats, workers: int | None = None):
        raise TypeError("qsgd shares no statistics (properties.shared_stats is None)")

    # -- encode ---------------------------------------------------------------------------------
    def prepare_many(self, layers: Mapping) -> None:
        """NonFiniteGradientError for a NaN/Inf gradient (first worker first); ValueError for a value
        beyond float32's range (float64 gradients only), naming the layer and the worker."""
        err = first_nonfinite(layers)
        if err is not None:
            raise err
        err = first_beyond_float32(layers, "qsgd sends float32 norms")
        if err is not None:
            raise err
        return None

    def _pack(self, q):
        if self.coding == "paper":
            return paper.encode(q)
        return elias.encode(q) if self.coding == "elias" else pack_fixed(q, self.levels)

    def encode(self, layers: Mapping, key, shared_scalers=None):
        """One worker's message of its layers {name: array} under StreamKey `key`
        (tgsim.codecs.base.encode_one: the worker's row of `encode_many`)."""
        return encode_one(self, layers, key, shared_scalers)

    def encode_many(self, layers: Mapping, seed: int, step: int, workers, shared_scalers=None, stats=None,
                    **_) -> list[QSGDMessage]:
        """One message per local worker; layer i of worker workers[w] draws from StreamKey(seed, step,
        workers[w], i), i = the layer's index `layer_ids(layers)` (its position unless `layers` is an
        IndexedLayers)."""
        shapes = {k: tuple(g.shape[1:]) for k, g in layers.items()}
        ids = layer_ids(layers)
        msgs = []
        for i, worker in enumerate(workers):
            norms, levels, payload, nbits = {}, {}, {}, {}
            for li, (k, g) in zip(ids, layers.items()):
                key = StreamKey(int(seed), int(step), int(worker), li)
                if self._numba(isinstance(g, np.ndarray)):
                    from tgsim.codecs import numba_qsgd

                    fixed = self.coding == "fixed"
                    norms[k], levels[k], pay, bits = numba_qsgd.encode(
                        g[i], key, self.levels, self.bucket, self.norm, level_dtype(self.levels), pack=fixed)
                    payload[k], nbits[k] = (pay, bits) if fixed else self._pack(levels[k])
                    continue
                nrm, q = quantize(g[i], key, self.levels, self.bucket, self.norm)
                norms[k], levels[k] = to_numpy(nrm), to_numpy(q)
                payload[k], nbits[k] = self._pack(levels[k])
            msgs.append(QSGDMessage(self._params, shapes, norms, levels, payload, nbits))
        return msgs

    # -- bytes ----------------------------------------------------------------------------------
    def from_bytes(self, buf, like: QSGDMessage) -> QSGDMessage:
        """The message in `buf`, checked against the receiver's layers `like` and this codec's
        parameters (PayloadError names what is wrong and where)."""
        shapes = dict(like.shapes)
        body = unframe(buf, _MAGIC, _VERSION, shapes, "qsgd message")
        if len(body) < PARAMS.size:
            raise PayloadError(f"qsgd message body is {len(body)} bytes, shorter than its parameters")
        got = PARAMS.unpack_from(body)
        if got != self._params:
            def text(p):
                names = (NORMS[p[2]] if p[2] < len(NORMS) else p[2], CODINGS[p[3]] if p[3] < len(CODINGS) else p[3])
                return f"levels={p[0]}, bucket={p[1]}, norm={names[0]!r}, coding={names[1]!r}"
            raise PayloadError(f"qsgd message has {text(got)}; this codec has {text(self._params)}")
        s, B = self.levels, self.bucket
        off = PARAMS.size
        norms, levels, payload, nbits = {}, {}, {}, {}
        for k, shape in shapes.items():
            n = int(np.prod(shape, dtype=np.int64))
            nb = bucket_count(n, B)
            what = f"qsgd message, layer {k!r}"
            if self.coding != "fixed":
                if off + _NBITS.size > len(body):
                    raise PayloadError(f"{what}: truncated before its bit length")
                bits = _NBITS.unpack_from(body, off)[0]
                off += _NBITS.size
                most = n * elias.max_code_bits(s) if self.coding == "elias" else paper.max_bits(n, s)
                if bits > most:
                    raise PayloadError(f"{what}: {bits} payload bits, more than {n} elements can take "
                                       f"({most} bits at most)")
            else:
                bits = n * (level_bits(s) + 1)
            need = 4 * nb + -(-bits // 8)
            if off + need > len(body):
                raise PayloadError(f"{what}: truncated ({len(body) - off} bytes left, the layer needs {need})")
            nrm = np.frombuffer(body, dtype="<f4", count=nb, offset=off).astype(np.float32)
            off += 4 * nb
            bad = ~np.isfinite(nrm) | np.signbit(nrm)
            if bad.any():
                j = int(np.argmax(bad))
                raise PayloadError(f"{what}: bucket {j} has norm {float(nrm[j])!r}, not a finite non-negative float32")
            pay = np.frombuffer(body, dtype=np.uint8, count=need - 4 * nb, offset=off).copy()
            off += need - 4 * nb
            if self.coding == "paper":
                q = paper.decode(pay, bits, n, s, what)
            else:
                q = elias.decode(pay, bits, n, s, what) if self.coding == "elias" else unpack_fixed(pay, n, s, what)
            q = q.astype(level_dtype(s), copy=False)
            if n and not nrm.all():
                stray = (np.repeat(nrm, B or n)[:n] == 0) & (q != 0)
                if stray.any():
                    i = int(np.argmax(stray))
                    raise PayloadError(f"{what}: element {i} has level {int(q[i])} in a bucket of norm 0")
            norms[k], levels[k], payload[k], nbits[k] = nrm, q, pay, int(bits)
        if off != len(body):
            raise PayloadError(f"qsgd message: {len(body) - off} bytes after the last layer")
        return QSGDMessage(got, shapes, norms, levels, payload, nbits)

    # -- decode and combine -------------------------------------------------------------------
    def decode(self, message: QSGDMessage) -> dict:
        return {k: dequantize(message.norms[k], message.levels[k], self.levels, self.bucket).reshape(shape)
                for k, shape in message.shapes.items()}

    def aggregate(self, messages: Sequence[QSGDMessage], divide_by: int | None = None) -> dict:
        divide_by = len(messages) if divide_by is None else divide_by
        if messages and self._numba(True):
            from tgsim.codecs import numba_qsgd

            return {k: numba_qsgd.decode_sum([m.levels[k] for m in messages], [m.norms[k] for m in messages],
                                             self.levels, self.bucket, int(np.prod(shape, dtype=np.int64)),
                                             divide_by).reshape(shape)
                    for k, shape in messages[0].shapes.items()}
        return ordered_mean([self.decode(m) for m in messages], divide_by)

    # -- bits -----------------------------------------------------------------------------------
    @property
    def bits_exact(self) -> bool:
        """Coding "fixed" sends a size that the shapes fix; "elias" and "paper" a data-dependent one."""
        return self.coding == "fixed"

    def bits_per_element(self, layers_or_shapes: Mapping) -> float:
        """8 (HEADER + PARAMS + Σ_l (N + 4 ceil(n_l / B) + P_l)) / Σ_l n_l: the frame's header, the
        parameters, per layer its bit length (N = 8 bytes, "elias" and "paper" only), its bucket norms
        and its payload P_l: "fixed" ceil(n_l (w + 1) / 8), w = ceil(log2(s + 1)) (exact); "elias"
        ceil(n_l c / 8), c the longest Elias code of a level, and "paper"
        ceil(qsgd_paper_coding.max_bits(n_l, s) / 8): the largest message (`bits_exact` False)."""
        sizes = [int(np.prod(s, dtype=np.int64)) for s in layer_shapes(layers_or_shapes).values()]
        s = self.levels
        body = 0
        for n in sizes:
            if self.coding == "fixed":
                payload = -(-n * (level_bits(s) + 1) // 8)
            elif self.coding == "paper":
                payload = -(-paper.max_bits(n, s) // 8)
            else:
                payload = -(-n * elias.max_code_bits(s) // 8)
            body += (0 if self.coding == "fixed" else _NBITS.size) + 4 * bucket_count(n, self.bucket) + payload
        return per_element_bits(HEADER.size + PARAMS.size + body, layers_or_shapes)

    def link_bits(self, n: int, workers: int) -> dict:
        """Uplink bits per element of a one-layer message of n elements (header, parameters, norms,
        padding included); downlink: the server's float32 mean (32).

        "fixed": "up" is exact (= "up_max"): 8 (HEADER + PARAMS + 4 ceil(n/B) + ceil(n w / 8)) / n.
        "elias": the count depends on the data. "up_max" holds for every gradient (every element at
        the longest code, 2 floor(log2(s+1)) + 2 bits; for s = 7 that is 8 bits, more than fixed's 4,
        so the fixed width is no bound). "up" bounds the expected count, for "l2" norms in the way
        of Alistarh et al.'s Theorem 3.4: per bucket of B elements, with L = Σ l_i and
        E L <= s ||v||_1 / ||v||_2 <= s sqrt(B), the bits Σ (2 floor(log2(l_i+1)) + 1 + [l_i > 0])
        <= B + min(B, L) + 2 B log2(1 + L / B) (Jensen), whose expectation is at most
        B + min(B, s sqrt(B)) + 2 B log2(1 + s / sqrt(B)); plus 7 bits of padding. For "max" norms
        the same argument with E L <= s B gives min(up_max, ...).
        "paper": "up_max" every element nonzero at the longest codes (qsgd_paper_coding.max_bits);
        "up" bounds the expected count: (8 (HEADER + PARAMS + 8 + 4 ceil(n/B)) + 7 +
        qsgd_paper_coding.expected_stream_bits(n, L)) / n, L = Σ_b s sqrt(B_b) for "l2" (as above)
        and s n for "max". For one l2 bucket, Alistarh et al.'s Theorem 3.2 bounds the stream plus
        the norm otherwise (qsgd_paper_coding.theorem_3_2_bits): lower for small s (5409 bits
        against this bound's 6660 at n = 1e5, s = 1), higher for large s (4285 against 3865 at
        n = 1e3, s = 16)."""
        if n == 0:
            return {"up": 0.0, "up_max": 0.0, "down": 32}
        s, B = self.levels, self.bucket or n
        nb = bucket_count(n, self.bucket)
        over = HEADER.size + PARAMS.size + 4 * nb
        if self.coding == "fixed":
            exact = 8 * (over + -(-n * (level_bits(s) + 1) // 8)) / n
            return {"up": exact, "up_max": exact, "down": 32}
        over += _NBITS.size
        sizes = [B] * (n // B) + ([n % B] if n % B else [])
        if self.coding == "paper":
            up_max = 8 * (over + -(-paper.max_bits(n, s) // 8)) / n
            mean_sum = sum(s * math.sqrt(size) if self.norm == "l2" else s * size for size in sizes)
            up = (8 * over + 7 + paper.expected_stream_bits(n, mean_sum)) / n
            return {"up": min(up, up_max), "up_max": up_max, "down": 32}
        up_max = 8 * (over + -(-n * elias.max_code_bits(s) // 8)) / n
        expected = 0.0
        for size in sizes:
            mean_l = s * math.sqrt(size) if self.norm == "l2" else s * size    # bound on E Σ l_i
            expected += size + min(size, mean_l) + 2 * size * math.log2(1 + mean_l / size)
        up = (8 * over + 7 + expected) / n
        return {"up": min(up, up_max), "up_max": up_max, "down": 32}
