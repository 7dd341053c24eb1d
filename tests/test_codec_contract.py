"""Two codec contracts.

* `TernGradContract` (test-only) instantiated for the TernGrad variants: round trip (encode ->
  to_bytes -> from_bytes -> decode equals the in-memory decode; values are ± the layer's scaler or
  0 with the sign of g, zero where g == 0; the same key gives the same bytes); header validation (a
  flipped header byte, a truncated or extended message, another layout: ValueError); declared
  unbiasedness by the exact binomial test (docs/THEORY.md §4): an unbiased codec is not rejected on
  a Gaussian and a heavy-tailed vector, a biased one (TernGrad(clip="explicit")) is rejected on the
  heavy-tailed one, so the declaration is true and the test has the power to see it;
  `exact_error(g)` against the Monte-Carlo mean of ||Q(g) - g||^2 inside a CLT interval; bits on
  the wire counted from the payload == `bits_per_element`; the integer sum of N workers' codes under
  a shared scaler, scaled by s/N, is bit for bit what `aggregate` returns.
* The public contract, tgsim.testing.CodecContract, for every registered codec.

Statistical checks use a family-wise alpha = 0.001 and fixed seeds (stated per test).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tgsim.analysis import unbiasedness as ub
from tgsim.codecs import TernGrad, from_bytes
from tgsim.codecs.packing import sum_codes, unpack
from tgsim.rng import StreamKey

from fakes import header_length

ALPHA = 1e-3


def through_bytes(message):
    """What a receiver gets: serialize and parse against the sender's layout."""
    return from_bytes(message.to_bytes(), message.layout)


def gaussian(n=2000, seed=11):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def heavy_tailed(n=2000, seed=12):
    """Student-t with 2 degrees of freedom (infinite variance)."""
    return np.random.default_rng(seed).standard_t(2, n).astype(np.float32)


class TernGradContract:
    """Checks of a TernGrad-style codec (ternary values, the TGM1 header, exact_error, the all-reduce
    of codes), parametrised by a ``codec`` fixture the subclass provides."""

    R = 1000  # draws for the statistical checks

    @pytest.fixture
    def codec(self):  # pragma: no cover - overridden
        raise NotImplementedError("subclasses provide the codec under test")

    # -- round trip ------------------------------------------------------------------------------
    def test_round_trip(self, codec):
        rng = np.random.default_rng(1)
        layers = {"w": rng.standard_normal((7, 13)).astype(np.float32),
                  "b": np.zeros(5, np.float32),
                  "e": np.zeros((3, 0), np.float32),
                  "t": rng.standard_t(2, 1001).astype(np.float32)}
        key = StreamKey(2024, step=3, worker=1)
        msg = codec.encode(layers, key)
        buf = msg.to_bytes()
        assert buf == codec.encode(layers, key).to_bytes(), "same key must give the same bytes"
        assert len(buf) == msg.wire_bytes
        back = codec.decode(from_bytes(buf, msg.layout))
        direct = codec.decode(msg)
        for i, (name, g) in enumerate(layers.items()):
            v = back[name]
            assert v.shape == g.shape and v.dtype == np.float32
            assert np.array_equal(v.view(np.uint32), direct[name].view(np.uint32))
            s = msg.scalers[i]
            assert np.all((v == 0) | (np.abs(v) == s)), name
            nz = v != 0
            assert np.all(np.sign(v[nz]) == np.sign(g[nz])), name
            assert np.all(v[g == 0] == 0), name

    # -- header validation -------------------------------------------------------------------
    def test_header_validation(self, codec):
        layers = {"a": gaussian(37), "b": gaussian(10, seed=3).reshape(2, 5)}
        msg = codec.encode(layers, StreamKey(5))
        buf = msg.to_bytes()
        hl = header_length(buf)
        for i in range(hl):
            bad = bytearray(buf)
            bad[i] ^= 0xFF
            with pytest.raises(ValueError):
                codec.decode(from_bytes(bytes(bad), msg.layout))
        for cut in (0, 1, hl - 1, hl, len(buf) - 1):
            with pytest.raises(ValueError):
                from_bytes(buf[:cut], msg.layout)
        with pytest.raises(ValueError):
            from_bytes(buf + b"\x00", msg.layout)
        other = codec.encode({"a": gaussian(37), "b": gaussian(10, seed=3)}, StreamKey(5))
        with pytest.raises(ValueError):
            from_bytes(buf, other.layout)

    # -- declared unbiasedness ---------------------------------------------------------------
    def _unbiasedness(self, codec, g, seed):
        draws = ub.codec_draws(codec, g, self.R, seed, roundtrip=through_bytes)
        if draws.magnitudes_ok and np.isfinite(draws.scalers).all():
            res = ub.binomial_test_of_draws(draws, alpha=ALPHA, hypothesis="unbiased")
            assert res.test == "exact binomial"
            return res
        return ub.mean_z_test(draws.sum, draws.sumsq, draws.R, draws.g, ALPHA)  # generic codecs

    def test_declared_unbiasedness(self, codec):
        """alpha = 0.001 family-wise (Bonferroni); seeds 101 (Gaussian) and 102 (Student-t, df=2)."""
        g_gauss, g_heavy = gaussian(), heavy_tailed()
        res_heavy = self._unbiasedness(codec, g_heavy, seed=102)
        if codec.unbiased:
            res_gauss = self._unbiasedness(codec, g_gauss, seed=101)
            assert not res_gauss.reject, res_gauss.summary()
            assert not res_heavy.reject, res_heavy.summary()
        else:
            assert res_heavy.reject, ("codec declares itself biased, but the test cannot see a bias "
                                      f"on a heavy-tailed vector: {res_heavy.summary()}")

    # -- exact error ---------------------------------------------------------------------------
    @pytest.mark.parametrize("kind", ["gaussian", "heavy_tailed"])
    def test_exact_error_monte_carlo(self, codec, kind):
        """E||Q(g) - g||^2 == codec.exact_error(g) inside a CLT interval, alpha = 0.001, seed 103."""
        g = gaussian() if kind == "gaussian" else heavy_tailed()
        draws = ub.codec_draws(codec, g, self.R, seed=103)
        res = ub.mse_interval_test(draws.sq_error, codec.exact_error(g), ALPHA)
        assert not res.reject, res.summary()

    # -- bits on the wire ----------------------------------------------------------------------
    @pytest.mark.parametrize("n", [1, 4, 5, 999, 1000, 4097])
    @pytest.mark.parametrize("workers", [1, 2, 8, 127])
    def test_bits_on_the_wire(self, codec, n, workers):
        msg = codec.encode({"g": gaussian(n)}, StreamKey(9))
        buf = msg.to_bytes()
        body_bits = 8 * (len(buf) - header_length(buf))
        bits = codec.link_bits(n, workers)
        assert math.isclose(bits["up"] * n, body_bits, rel_tol=1e-12), (bits, body_bits)
        # downlink: a sum of N codes takes 2N + 1 values
        assert 2 ** (bits["down"] - 1) < 2 * workers + 1 <= 2 ** bits["down"]

    # -- all-reduce compatibility --------------------------------------------------------------
    def test_allreduce_compatible(self, codec):
        if not codec.allreduce_compatible:
            pytest.skip("codec does not claim all-reduce compatibility")
        rng = np.random.default_rng(7)
        N, n = 5, 333
        grads = [{"g": (rng.standard_normal(n) * (w + 1)).astype(np.float32)} for w in range(N)]
        local = [codec.local_scalers(codec.scaling(g)) for g in grads]
        shared = np.max(local, axis=0)
        msgs = [through_bytes(codec.encode(g, StreamKey(3, worker=w), shared_scalers=shared))
                for w, g in enumerate(grads)]
        payloads = np.stack([m.parts[0] for m in msgs])
        ints = sum_codes(payloads, n, codec.packing)
        assert ints.dtype == np.int8
        expect = sum(unpack(m.parts[0], n, codec.packing).astype(np.int64) for m in msgs)
        assert np.array_equal(ints.astype(np.int64), expect)
        s = np.float64(shared[0])
        want = (s * expect.astype(np.float64) * np.float64(1.0 / N)).astype(np.float32)
        got = codec.aggregate(msgs, divide_by=N)["g"]
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


class TestTernGradNoClip(TernGradContract):
    @pytest.fixture
    def codec(self):
        return TernGrad(clip="none", kernels="reference")


class TestTernGradBase3(TernGradContract):
    @pytest.fixture
    def codec(self):
        return TernGrad(packing="base3", kernels="reference")


class TestTernGradExplicitClip(TernGradContract):
    @pytest.fixture
    def codec(self):
        return TernGrad(clip="explicit", kernels="reference")

    def test_declares_biased(self, codec):
        assert codec.unbiased is False


# -- the public contract (tgsim.testing) for every registered codec ------------------------------

from tgsim.codecs import registry  # noqa: E402
from tgsim.testing import CodecContract as PublicContract  # noqa: E402
from tgsim.train.config import CodecConfig  # noqa: E402

REGISTERED = [(name, {}) for name in registry.names()] + [("terngrad", {"clip": "none"}),
                                                          ("terngrad", {"scope": "model"}),
                                                          ("terngrad", {"clip": "implicit", "packing": "base3"})]


class TestEveryRegisteredCodec(PublicContract):
    @pytest.fixture(params=REGISTERED, ids=lambda p: p[0] + "".join(f"-{k}={v}" for k, v in p[1].items()))
    def codec(self, request):

        name, options = request.param
        return registry.make_codec(CodecConfig(name=name, options=options))
