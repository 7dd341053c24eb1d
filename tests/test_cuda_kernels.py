"""The CUDA path of the codec (tgsim/cuda/*.cu, tgsim/codecs/terngrad/cuda.py) against the NumPy reference, bit for bit.

Without a GPU (marker `nvcc`):
  * nvcc builds tgsim/cuda/host_harness.cu into a shared library, once per session, into a pytest
    tmp dir. The harness #includes terngrad.cu, so the same run also compiles every __global__
    kernel for the device (a kernel that does not compile fails the build). Each tg_host_<kernel>
    function runs the per-thread body of kernel <kernel> (the same __host__ __device__ function)
    for every logical thread index; ctypes calls it and the result is compared with
    tgsim.rng / tgsim.codecs.{stats,ternary,packing}.
  * nvcc --ptx compiles the exact source the wrapper hands to NVRTC (philox.cuh inlined) with the
    wrapper's NVRTC options as CuPy applies them: the six kernels must be there, no FMA.
  * The wrapper itself (tgsim.codecs.terngrad.cuda) runs against a stand-in `cupy` module whose RawModule
    kernels dispatch to the harness, checking every kernel argument's type against the kernel's
    C signature (parsed from terngrad.cu). Like real CuPy it compiles with -ftz=true appended
    (tests/cupy_api.py), so its kernels run with x86 FTZ+DAZ set (denormal float32 read and written
    as zeros, as the GPU's .ftz instructions do): issue 23's H100 failures on denormals and signed
    zeros reproduce here with the old kernels. Its functions refuse keywords CuPy refuses.
  * The PTX is compiled with the options CuPy really uses (-ftz=true last) and may hold no .ftz
    instruction and no float32 arithmetic: nothing FTZ could change.
With a GPU and CuPy (marker `gpu`): the same wrapper tests run on the device.

Build command (checked with CUDA 13.0 nvcc and gcc 12.2 as host compiler; nvcc's default device
arch for CUDA 13 is sm_75, no -arch needed):
    nvcc -O2 -shared -Xcompiler -fPIC,-ffp-contract=off --fmad=false -o libtg_host.so host_harness.cu
-Xcompiler -fPIC: needed for a shared library; -ffp-contract=off: gcc must not fuse the host bodies'
a*b+c into FMA (the device bodies use __dadd_rn/__dmul_rn, which are never fused); --fmad=false:
the device pass is compiled as the wrapper compiles it with NVRTC.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tgsim import backend
from tgsim.codecs import packing
from tgsim.codecs.terngrad import cuda as _cuda, reference as _reference, moments as stats, quantizer as ternary
from tgsim.errors import NonFiniteGradientError
from tgsim.rng import StreamKey, philox4x32_10, random_words
from tgsim.rng.philox import MAX_ELEMENTS

from cuda_harness import (KEYS, KINDS, LANES, NO_BAD, SCALER_SETS, SIZES, assert_same_bits, corrupt, f64bits,
                          fake_cupy, h_encode, h_moments, h_sum_codes, h_weighted_sum, host_name,
                          kernel_signatures, make_layer, needs_gpu, needs_nvcc, random_payloads, ref_encode,
                          ref_lanes, same_float, scalers_for, scalings)
from fakes import EDGE_LAYER, EDGE_SEED, EDGE_STEP, edge_threshold_rows


# ------------------------------------------------------------------------------------------------
# the module source and the build
# ------------------------------------------------------------------------------------------------
def test_module_imports_without_cupy():
    code = ("import sys; sys.modules['cupy'] = None; import tgsim.codecs.terngrad.cuda as c; "
            "assert 'cupy' not in [m for m in sys.modules if sys.modules[m] is not None]")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)


def test_module_source_is_self_contained():
    src = _cuda.source()
    assert not re.search(r"^\s*#\s*include", src, flags=re.M), "NVRTC has no system headers"
    assert set(kernel_signatures()) == set(_cuda.KERNELS)


@pytest.mark.usefixtures("builds")
class TestBuild:
    pytestmark = needs_nvcc

    def test_host_functions_mirror_kernels(self, h):
        kernels = kernel_signatures()
        assert set(_cuda.KERNELS) == set(kernels)
        for name, params in kernels.items():
            assert h.sigs[host_name(name)] == params, name
        assert h.lib.tg_host_lanes() == LANES

    def test_ptx_has_every_kernel_and_no_fma(self, builds):
        entries = re.findall(r"\.entry\s+(\w+)\(", builds.ptx)
        assert sorted(entries) == sorted(_cuda.KERNELS)
        fused = sorted(set(re.findall(r"\b(fma\.\w+(?:\.\w+)*|mad\.\w*f\d+)", builds.ptx)))
        assert not fused, f"FMA in the module: {fused}"
        # compiled as CuPy compiles it (-ftz=true appended): no instruction that FTZ could change,
        # i.e. float32 only moves (ld/st/mov/selp), never arithmetic, compares or conversions
        assert "-ftz=true" in builds.cmds[1]
        ftz = sorted(set(re.findall(r"\b\w+(?:\.\w+)*\.ftz(?:\.\w+)*", builds.ptx)))
        assert not ftz, f"float32 instructions that flush denormals under CuPy's -ftz=true: {ftz}"
        f32 = {op.split(".")[0] for op in re.findall(r"\b([a-z]+(?:\.\w+)*\.f32)\b", builds.ptx)}
        assert f32 <= {"ld", "st", "mov", "selp"}, f"float32 arithmetic in the module: {sorted(f32)}"


# ------------------------------------------------------------------------------------------------
# Philox
# ------------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("builds")
class TestPhilox:
    pytestmark = needs_nvcc

    # Random123 kat_vectors, philox4x32_10
    KAT = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]

    def test_known_answers(self, h):
        ctr = np.array([c for c, _, _ in self.KAT], dtype=np.uint32)
        keys = np.array([k for _, k, _ in self.KAT], dtype=np.uint32)
        out = np.zeros_like(ctr)
        h.call("tg_host_philox", np.int64(len(ctr)), ctr, keys, out)
        assert out.tolist() == [list(e) for _, _, e in self.KAT]
        ref = philox4x32_10(tuple(ctr.T), (0, 0))   # reference agrees on the first vector
        assert [int(x[0]) for x in ref] == list(self.KAT[0][2])

    def test_random_counters_and_keys(self, h):
        rng = np.random.default_rng(1)
        ctr = rng.integers(0, 2**32, (64, 4), dtype=np.uint32)
        keys = rng.integers(0, 2**32, (64, 2), dtype=np.uint32)
        out = np.zeros_like(ctr)
        h.call("tg_host_philox", np.int64(64), ctr, keys, out)
        for i in range(64):
            ref = philox4x32_10(tuple(ctr[i:i + 1].T), (int(keys[i, 0]), int(keys[i, 1])))
            assert out[i].tolist() == [int(x[0]) for x in ref]

    @pytest.mark.parametrize("key", KEYS)
    @pytest.mark.parametrize("start,n", [(0, 0), (0, 1), (0, 4), (3, 18), (0, 1001), (MAX_ELEMENTS - 23, 23)])
    def test_stream_words(self, h, key, start, n):
        out = np.zeros(n, dtype=np.uint32)
        h.call("tg_host_random_words", np.int64(n), np.int64(start), np.uint32(key.key[0]),
               np.uint32(key.key[1]), np.uint32(key.layer), np.uint32(key.worker), np.uint32(key.step), out)
        assert_same_bits(out, random_words(n, key, start=start))


# ------------------------------------------------------------------------------------------------
# moments
# ------------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("builds")
class TestMoments:
    pytestmark = needs_nvcc

    @pytest.mark.parametrize("kind", KINDS)
    @pytest.mark.parametrize("n", SIZES)
    def test_lanes_tree_and_moments(self, h, n, kind):
        g = make_layer(kind, n)
        (s1, s2, amax), (t1, t2, tmax), bad = h_moments(h, g)
        r1, r2 = ref_lanes(g)
        assert_same_bits(s1, r1)
        assert_same_bits(s2, r2)
        _, e1, e2 = stats.lane_sums(g)
        assert f64bits(t1) == f64bits(e1) and f64bits(t2) == f64bits(e2)
        assert bad == 0
        ref = stats.layer_moments(g, need_sigma=True)
        assert tmax == ref.absmax and float(amax.max(initial=0.0)) == ref.absmax
        assert same_float(stats.moments_from_sums(n, 0.0, t1, t2), ref.sigma)

    @pytest.mark.parametrize("n,where", [(1, 0), (20, 19), (65537, 65536), (100_003, 70_000)])
    @pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
    def test_nonfinite_flag(self, h, n, where, value):
        g = make_layer("normal", n)
        g[where] = value
        assert h_moments(h, g)[2] == 1
        assert not stats.layer_moments(g).finite


# ------------------------------------------------------------------------------------------------
# encode
# ------------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("builds")
class TestEncode:
    pytestmark = needs_nvcc

    @pytest.mark.parametrize("kind", KINDS)
    @pytest.mark.parametrize("n", SIZES)
    def test_matches_ternarize_and_pack(self, h, n, kind):
        g = make_layer(kind, n, seed=1)
        key = KEYS[(SIZES.index(n) + KINDS.index(kind)) % len(KEYS)]
        for clip, sc in scalings(g).items():
            for fmt in packing.FORMATS:
                got = h_encode(h, g, sc.scaler, sc.clip_bound, key, fmt)
                assert_same_bits(got, ref_encode(g, sc.scaler, sc.clip_bound, key, fmt))
            # a shared scaler above the local one (as after the MAX all-reduce)
            s = float(np.float32(min(sc.scaler * 1.75 + 1e-30, 3.4e38)))
            got = h_encode(h, g, s, sc.clip_bound, key, "2bit")
            assert_same_bits(got, ref_encode(g, s, sc.clip_bound, key, "2bit"))

    @pytest.mark.parametrize("cb", [float("inf"), 0.5, 2.0**-24])
    def test_rule_at_the_boundary(self, h, cb):
        """x = (t + δ)/2^24 with s = 1: the exact products hit equality, where the rule says 0."""
        key, n = KEYS[0], 4099
        t = (random_words(n, key) >> np.uint32(8)).astype(np.int64)
        rng = np.random.default_rng(2)
        x = np.clip(t + rng.integers(-1, 2, n), 0, 2**24 - 1) / 2.0**24
        g = (x * np.where(rng.random(n) < 0.5, -1.0, 1.0)).astype(np.float32)
        g[::7] = -0.0
        codes = np.zeros(n, dtype=np.int8)
        h.call("tg_host_ternary_codes", g, np.int64(n), np.float32(1.0), np.float32(cb),
               np.uint32(key.key[0]), np.uint32(key.key[1]), np.uint32(key.layer), np.uint32(key.worker),
               np.uint32(key.step), codes)
        ref = ternary.ternarize(g, 1.0, key, cb)
        assert_same_bits(codes, ref)
        if cb == float("inf"):
            on_boundary = np.abs(g).astype(np.float64) * 2.0**24 == t
            assert on_boundary.sum() > 100 and not codes[on_boundary].any()
        for fmt in packing.FORMATS:
            assert_same_bits(h_encode(h, g, 1.0, cb, key, fmt), ref_encode(g, 1.0, cb, key, fmt))

    @pytest.mark.parametrize("scaler", [1.0, 2.0**-30, 0.3, 3.4028235e38, 1e-45])
    def test_rule_at_the_edge_thresholds(self, h, scaler):
        """x at the boundary t s / 2^24 of its word and one float32 step either side, x = s (|g| = s)
        and around it, for the smallest (t = 0, 1) and largest (t = 2^24 - 2, 2^24 - 1) thresholds
        (fakes.edge_threshold_rows), clipped explicitly or not: the codes and both packings equal the
        reference's, bit for bit (s = 1, 2^-30: every boundary is a float32; 0.3: they round)."""
        s = np.float32(scaler)
        G, workers = edge_threshold_rows(s, 5)
        for cb in (np.inf, s):
            for g, w in zip(G, workers):
                key = StreamKey(EDGE_SEED, EDGE_STEP, int(w), EDGE_LAYER)
                codes = np.zeros(g.size, dtype=np.int8)
                h.call("tg_host_ternary_codes", g, np.int64(g.size), s, np.float32(cb), np.uint32(key.key[0]),
                       np.uint32(key.key[1]), np.uint32(key.layer), np.uint32(key.worker), np.uint32(key.step),
                       codes)
                assert_same_bits(codes, ternary.ternarize(g, s, key, cb))
                for fmt in packing.FORMATS:
                    assert_same_bits(h_encode(h, g, s, cb, key, fmt), ref_encode(g, s, cb, key, fmt))

    @pytest.mark.parametrize("kind", ["range", "zeros", "denormal"])
    @pytest.mark.parametrize("s", [0.0, 1e-45, 3.4028235e38, float("inf"), -1.0, float("nan")])
    def test_extreme_scalers(self, h, s, kind):
        """The rule as written, for any scaler (a negative one even decides the sign of ±0)."""
        g = make_layer(kind, 1003)
        for cb in (float("inf"), 1e-40):
            for fmt in packing.FORMATS:
                assert_same_bits(h_encode(h, g, s, cb, KEYS[1], fmt), ref_encode(g, s, cb, KEYS[1], fmt))

    @pytest.mark.parametrize("cb", [float("inf"), 0.25, float("nan")])
    def test_nonfinite_elements(self, h, cb):
        """NaN/Inf never reach encode through the codec, but the rule still equals the reference's
        (x = np.minimum(|g|, clip_bound) propagates NaN: a NaN element or bound gives code 0)."""
        g = make_layer("normal", 1001, seed=9)
        g[::5], g[1::7], g[2::11] = np.nan, np.inf, -np.inf
        for fmt in packing.FORMATS:
            assert_same_bits(h_encode(h, g, 0.03, cb, KEYS[2], fmt), ref_encode(g, 0.03, cb, KEYS[2], fmt))


# ------------------------------------------------------------------------------------------------
# weighted sum, code sum, validation
# ------------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("builds")
class TestDecode:
    pytestmark = needs_nvcc

    @pytest.mark.parametrize("fmt", packing.FORMATS)
    @pytest.mark.parametrize("n", SIZES)
    def test_weighted_sum(self, h, n, fmt):
        for workers in (1, 3, 8):
            p = random_payloads(workers, n, fmt)
            for skind in SCALER_SETS:
                s = scalers_for(skind, workers)
                for divide_by in (1, 3, workers):
                    got, bad = h_weighted_sum(h, p, s, n, fmt, divide_by)
                    with np.errstate(all="ignore"):
                        ref = packing.weighted_sum(p, s, n, fmt, divide_by)
                    assert bad == NO_BAD
                    assert_same_bits(got, ref)

    def test_no_workers(self, h):
        p = np.zeros((0, 3), dtype=np.uint8)
        got, bad = h_weighted_sum(h, p, np.zeros(0, np.float32), 10, "2bit", 1)
        assert bad == NO_BAD
        assert_same_bits(got, packing.weighted_sum(p, [], 10, "2bit", 1))

    @pytest.mark.parametrize("fmt", packing.FORMATS)
    @pytest.mark.parametrize("n", [0, 1, 5, 21, 65537, 100_003])
    def test_sum_codes(self, h, n, fmt):
        for workers in (1, 4, 130):
            p = random_payloads(workers, n, fmt, seed=3)
            got, bad = h_sum_codes(h, p, n, fmt)
            assert bad == NO_BAD
            ref = packing.sum_codes(p, n, fmt)
            assert_same_bits(got.astype(ref.dtype), ref)
            assert_same_bits(got, packing.sum_codes(p, n, fmt, np.int32))

    corrupt = staticmethod(corrupt)

    CASES = [  # (n, [(worker, byte, what)], expected (worker, byte))
        (1000, [(1, 3, "code")], (1, 3)),
        (1000, [(2, 0, "code"), (1, 7, "code")], (1, 7)),
        (21, [(0, -1, "pad")], (0, -1)),
        (21, [(0, -1, "pad"), (0, 2, "code")], (0, 2)),
        (22, [(2, -1, "pad"), (1, -1, "pad")], (1, -1)),
        (100_003, [(3, -1, "pad"), (3, 12_345, "code")], (3, 12_345)),
    ]

    @pytest.mark.parametrize("fmt", packing.FORMATS)
    @pytest.mark.parametrize("case", CASES)
    def test_invalid_payloads(self, h, fmt, case):
        n, edits, (ew, eb) = case
        workers = 4
        p = random_payloads(workers, n, fmt, seed=4)
        nb = p.shape[1]
        if any(what == "pad" for _, _, what in edits) and n % packing.CODES_PER_BYTE[fmt] == 0:
            pytest.skip("no pad codes")
        for w, b, what in edits:
            self.corrupt(fmt, p, n, w, b % nb, what)
        expected = ew * nb + eb % nb
        s = scalers_for("distinct", workers)
        got, bad = h_weighted_sum(h, p, s, n, fmt, 2)
        assert bad == expected
        with np.errstate(all="ignore"):
            assert_same_bits(got, packing.weighted_sum(p, s, n, fmt, 2))   # invalid bytes decode as 0
        assert h_sum_codes(h, p, n, fmt)[1] == expected
        # the reference names the same worker and byte
        with pytest.raises(ValueError, match=rf"payload of worker {ew}: "):
            _reference.weighted_sum(p, s, n, fmt, 2)
        try:
            packing.check_payload(p[ew], n, fmt)
        except ValueError as e:
            m = re.search(r"at byte (\d+)", str(e))
            assert (int(m.group(1)) if m else nb - 1) == eb % nb
        else:
            raise AssertionError("reference accepted the payload")


# ------------------------------------------------------------------------------------------------
# the wrapper, tgsim.codecs.terngrad.cuda: same tests with a stand-in CuPy (harness) and on a real GPU
# ------------------------------------------------------------------------------------------------
class _WrapperContract:
    """Wrapper vs `_reference`, bit for bit. Subclasses provide dev() / host() and the array module."""

    launches: list

    def dev(self, a):
        raise NotImplementedError

    def host(self, a):
        raise NotImplementedError

    @pytest.mark.parametrize("kind", ["normal", "denormal", "zeros", "range", "mixed"])
    @pytest.mark.parametrize("n", [0, 1, 5, 21, 65537, 100_003])
    def test_moments(self, n, kind):
        g = make_layer(kind, n, seed=5)
        for need_sigma in (True, False):
            got = _cuda.moments(self.dev(g), need_sigma)
            ref = _reference.moments(g, need_sigma)
            assert got.finite == ref.finite
            assert same_float(got.absmax, ref.absmax) and same_float(got.sigma, ref.sigma), (got, ref)

    @pytest.mark.parametrize("value", [np.nan, np.inf])
    def test_moments_nonfinite(self, value):
        g = make_layer("normal", 70_001)
        g[66_000] = value
        got = _cuda.moments(self.dev(g), True)
        assert not got.finite and math.isnan(got.absmax) and math.isnan(got.sigma)

    @pytest.mark.parametrize("kind", ["normal", "denormal", "mixed"])
    @pytest.mark.parametrize("n", [0, 1, 19, 20, 21, 65537, 100_003])
    def test_encode(self, n, kind):
        g = make_layer(kind, n, seed=6)
        for i, (clip, sc) in enumerate(scalings(g).items()):
            key = KEYS[i % len(KEYS)]
            for fmt in packing.FORMATS:
                got = _cuda.encode(self.dev(g), sc.scaler, sc.clip_bound, key, fmt)
                ref = _reference.encode(g, sc.scaler, sc.clip_bound, key, fmt)
                assert_same_bits(self.host(got), ref)

    @pytest.mark.parametrize("fmt", packing.FORMATS)
    @pytest.mark.parametrize("n", [0, 1, 21, 65537, 100_003])
    def test_weighted_sum_and_sum_codes(self, n, fmt):
        for workers in (1, 5):
            p = random_payloads(workers, n, fmt, seed=7)
            for skind in SCALER_SETS:
                s = scalers_for(skind, workers)
                with np.errstate(all="ignore"):
                    ref = _reference.weighted_sum(p, s, n, fmt, 3)
                got = _cuda.weighted_sum(self.dev(p), self.dev(s), n, fmt, 3)
                assert_same_bits(self.host(got), ref)
            # a list of payloads and Python-float scalers that are float32 values
            got = _cuda.weighted_sum([self.dev(r) for r in p], [float(x) for x in s], n, fmt, 1)
            with np.errstate(all="ignore"):
                assert_same_bits(self.host(got), _reference.weighted_sum(p, s, n, fmt, 1))
            assert_same_bits(self.host(_cuda.sum_codes(self.dev(p), n, fmt)), _reference.sum_codes(p, n, fmt))
            assert_same_bits(self.host(_cuda.sum_codes(self.dev(p), n, fmt, np.int32)),
                             _reference.sum_codes(p, n, fmt, np.int32))

    @pytest.mark.parametrize("fmt", packing.FORMATS)
    def test_invalid_payloads_raise_like_the_reference(self, fmt):
        n = 1001
        p = random_payloads(3, n, fmt, seed=8)
        nb = p.shape[1]
        q = p.copy()
        TestDecode.corrupt(fmt, q, n, 2, 17, "code")
        TestDecode.corrupt(fmt, q, n, 1, nb - 1, "pad")
        s = scalers_for("shared", 3)
        for fn, args in ((_cuda.weighted_sum, (s, n, fmt, 1)), (_cuda.sum_codes, (n, fmt))):
            with pytest.raises(ValueError, match=r"payload of worker 1: non-zero pad codes after element 1001"):
                fn(self.dev(q), *args)
        TestDecode.corrupt(fmt, q, n, 1, 40, "code")
        kind = "code 0b11" if fmt == "2bit" else r"byte > 242"
        msg = rf"payload of worker 1: invalid {kind} at byte 40 \(0x{q[1, 40]:02x}\)"
        with pytest.raises(ValueError, match=msg):
            _reference.weighted_sum(q, s, n, fmt, 1)
        with pytest.raises(ValueError, match=msg):
            _cuda.weighted_sum(self.dev(q), self.dev(s), n, fmt, 1)
        with pytest.raises(ValueError, match=msg):
            _cuda.sum_codes(self.dev(q), n, fmt)
        with pytest.raises(ValueError, match=rf"payload of worker 0: {nb - 1} bytes for 1001 elements"):
            _cuda.weighted_sum(self.dev(p[:, :-1]), s, n, fmt, 1)

    def test_non_contiguous_inputs(self):
        g = make_layer("normal", 2 * 1001, seed=10)
        key = KEYS[0]
        got = _cuda.encode(self.dev(g)[::2], 0.05, float("inf"), key, "2bit")
        assert_same_bits(self.host(got), _reference.encode(g[::2].copy(), 0.05, float("inf"), key, "2bit"))
        got = _cuda.moments(self.dev(g)[1::2], True)
        assert got == _reference.moments(g[1::2].copy(), True)
        p = random_payloads(3, 1001, "base3", seed=11)
        wide = np.zeros((3, 2 * p.shape[1]), dtype=np.uint8)
        wide[:, ::2] = p
        s = scalers_for("distinct", 3)
        wide_s = np.repeat(s, 2)
        got = _cuda.weighted_sum(self.dev(wide)[:, ::2], self.dev(wide_s)[::2], 1001, "base3", 2)
        with np.errstate(all="ignore"):
            assert_same_bits(self.host(got), _reference.weighted_sum(p, s, 1001, "base3", 2))
        got = _cuda.sum_codes(self.dev(wide)[:, ::2], 1001, "base3")
        assert_same_bits(self.host(got), _reference.sum_codes(p, 1001, "base3"))

    # -- the whole-step forms: every (worker, layer) row in one launch (issue 23 item 3) --------------
    STEP_LAYERS = [(0, "normal"), (1, "denormal"), (21, "mixed"), (4097, "zeros"), (65537, "denormal"),
                   (100_003, "normal"), (5, "constant")]

    def step_rows(self, workers: int = 3):
        """(W, n) float32 rows per layer of STEP_LAYERS, worker w's row from seed 20 + w."""
        return [np.stack([make_layer(kind, n, seed=20 + w) for w in range(workers)]) if n else
                np.zeros((workers, 0), np.float32) for n, kind in self.STEP_LAYERS]

    def test_moments_layers_equal_each_layer_and_the_reference(self):
        Gs = self.step_rows()
        Gs[2][1, 7] = np.nan                      # worker 1 of layer 2 non-finite
        for need_sigma in (True, False):
            got = _cuda.moments_layers([self.dev(G) for G in Gs], need_sigma)
            assert len(got) == len(Gs)
            for G, (absmax, sigma, finite) in zip(Gs, got):
                for w in range(G.shape[0]):
                    ref = _reference.moments(G[w], need_sigma)
                    assert bool(finite[w]) == ref.finite
                    assert same_float(float(absmax[w]), ref.absmax) and same_float(float(sigma[w]), ref.sigma), \
                        (G.shape, w, absmax[w], sigma[w], ref)

    def test_moments_layers_long_rows_take_the_two_kernels(self, monkeypatch):
        """Rows longer than ROW_MAX go through moments_many: same bits either way."""
        Gs = self.step_rows(2)
        whole = _cuda.moments_layers([self.dev(G) for G in Gs], True)
        monkeypatch.setattr(_cuda, "ROW_MAX", 30)
        split = _cuda.moments_layers([self.dev(G) for G in Gs], True)
        for a, b in zip(whole, split):
            for x, y in zip(a, b):
                assert_same_bits(np.asarray(x), np.asarray(y))

    @pytest.mark.parametrize("fmt", packing.FORMATS)
    def test_encode_layers_equal_each_layer_and_the_reference(self, fmt):
        Gs = self.step_rows()
        workers = np.array([4, 0, 2**32 - 1], dtype=np.uint32)
        seed, step = KEYS[0].seed, 77
        scal = [[ternary.scaling_from_moments(*_reference.moments(G[w], True)[:2], "explicit", 2.5)
                 for w in range(G.shape[0])] for G in Gs]
        S = np.array([[sc[w].scaler for sc in scal] for w in range(3)], dtype=np.float32)
        bounds = [np.array([sc[w].clip_bound for w in range(3)]) for sc in scal]
        layer_ids = [9, 0, 3, 2**32 - 1, 1, 2, 5]
        got = _cuda.encode_layers([self.dev(G) for G in Gs], S, bounds, seed, step, workers, layer_ids, fmt)
        for i, G in enumerate(Gs):
            one = _cuda.encode_many(self.dev(G), S[:, i], bounds[i], seed, step, workers, layer_ids[i], fmt)
            assert_same_bits(self.host(got[i]), self.host(one))
            for w in range(3):
                key = StreamKey(seed, step, int(workers[w]), layer_ids[i])
                assert_same_bits(self.host(got[i])[w], ref_encode(G[w], S[w, i], bounds[i][w], key, fmt))

    def test_argument_errors(self):
        p = random_payloads(2, 10, "2bit")
        with pytest.raises(ValueError, match="float32 values"):
            _cuda.weighted_sum(self.dev(p), [0.1, 1.0], 10, "2bit", 1)
        with pytest.raises(ValueError, match="3 scalers for 2 payloads"):
            _cuda.weighted_sum(self.dev(p), [1.0, 1.0, 1.0], 10, "2bit", 1)
        with pytest.raises(ValueError, match="float32 layer"):
            _cuda.moments(self.dev(np.zeros(4)), True)
        with pytest.raises(ValueError, match="unknown packing"):
            _cuda.encode(self.dev(np.zeros(4, np.float32)), 1.0, float("inf"), KEYS[0], "1bit")




class TestWrapperOnHostHarness(_WrapperContract):
    pytestmark = needs_nvcc

    @pytest.fixture(autouse=True)
    def _fake_cupy(self, h, monkeypatch):
        backend.gpu_available()            # fill backend's caches with the real answer first
        self.launches = []
        _cuda._reset_cache()
        monkeypatch.setitem(sys.modules, "cupy", fake_cupy(h, self.launches))
        # the stand-in's device arrays are host arrays: their addresses fill the pointer tables
        monkeypatch.setattr(_cuda, "_address", lambda a: int(a.ctypes.data))
        yield
        _cuda._reset_cache()

    def dev(self, a):
        return np.asarray(a)

    def host(self, a):
        assert isinstance(a, np.ndarray)
        return a

    def test_launch_configuration(self):
        g = make_layer("normal", 100_003)
        _cuda.moments(g, True)
        _cuda.encode(g, 1.0, float("inf"), KEYS[0], "base3")
        names = [name for name, _, _ in self.launches]
        assert names == ["tg_moments_lanes", "tg_moments_tree", "tg_encode_base3"]

    @pytest.mark.parametrize("fmt", packing.FORMATS)
    def test_codec_step_through_the_cuda_kernels(self, fmt, monkeypatch):
        """TernGrad.encode_many with the CUDA kernels (the stand-in) gives the reference kernels'
        messages byte for byte, with one tg_moments_rows and one tg_encode_rows launch for the whole
        step (float layer "bias" included; MAX-shared scalers too), and aggregate the same mean with one
        tg_weighted_sum_rows launch; a NaN gives the same error."""
        from tgsim.codecs.terngrad.codec import TernGrad
        rng = np.random.default_rng(3)
        layers = {"conv": rng.standard_normal((3, 4, 5, 7)).astype(np.float32) * 1e-2,
                  "bias": rng.standard_normal((3, 6)).astype(np.float32),
                  "fc": make_layer("denormal", 3 * 1001, seed=4).reshape(3, 1001),
                  "out": rng.standard_normal((3, 70_001)).astype(np.float32)}
        codec = TernGrad(clip="explicit", packing=fmt, float_layers=("bias",), kernels="reference")
        workers = np.array([0, 1, 7], dtype=np.uint32)
        ref = codec.encode_many(layers, 11, 3, workers)
        ref_shared = codec.encode_many(layers, 11, 3, workers, shared_scalers=np.float32([0.5, 0, 0.5, 4.0]))
        ref_mean = codec.aggregate(ref_shared, 3)
        monkeypatch.setattr(TernGrad, "kernels_for", lambda self, xp: _cuda)
        self.launches.clear()
        got = codec.encode_many(layers, 11, 3, workers)
        assert [name for name, _, _ in self.launches] == ["tg_moments_rows", "tg_encode_rows"]
        assert [m.to_bytes() for m in got] == [m.to_bytes() for m in ref]
        got = codec.encode_many(layers, 11, 3, workers, shared_scalers=np.float32([0.5, 0, 0.5, 4.0]))
        assert [m.to_bytes() for m in got] == [m.to_bytes() for m in ref_shared]
        self.launches.clear()
        mean = codec.aggregate(got, 3)
        assert [name for name, _, _ in self.launches] == ["tg_weighted_sum_rows"]
        assert list(mean) == list(ref_mean)
        for k in mean:
            assert_same_bits(mean[k], ref_mean[k])
        layers["out"][1, 9] = np.nan
        with pytest.raises(NonFiniteGradientError, match="'out'.*worker 1"):
            codec.encode_many(layers, 11, 3, workers)

    @pytest.mark.parametrize("fmt", packing.FORMATS)
    def test_weighted_sum_layers_equal_each_layer(self, fmt):
        """weighted_sum_layers: every layer's weighted_sum in one launch; an invalid byte raises the
        error of the first layer (in layer order) that has one, worded as weighted_sum words it."""
        sizes = [1, 0, 21, 65537, 1001]
        P = [random_payloads(5, n, fmt, seed=30 + i) for i, n in enumerate(sizes)]
        S = np.stack([scalers_for("distinct", 5), scalers_for("shared", 5)] * 2 + [scalers_for("distinct", 5)], 1)
        got = _cuda.weighted_sum_layers([self.dev(p) for p in P], self.dev(S), sizes, fmt, 3)
        for i, n in enumerate(sizes):
            with np.errstate(all="ignore"):
                assert_same_bits(self.host(got[i]), _reference.weighted_sum(P[i], S[:, i], n, fmt, 3))
        TestDecode.corrupt(fmt, P[4], 1001, 2, 17, "code")
        TestDecode.corrupt(fmt, P[3], 65537, 1, P[3].shape[1] - 1, "pad")
        with pytest.raises(ValueError, match=r"payload of worker 1: non-zero pad codes after element 65537"):
            _cuda.weighted_sum_layers([self.dev(p) for p in P], self.dev(S), sizes, fmt, 3)

    def test_whole_step_is_one_launch_each(self):
        """moments_layers and encode_layers: one launch for every row of every layer."""
        Gs = self.step_rows(4)
        self.launches.clear()
        m = _cuda.moments_layers(Gs, True)
        S = np.array([[max(float(m[i][0][w]), 1e-3) for i in range(len(Gs))] for w in range(4)], np.float32)
        _cuda.encode_layers(Gs, S, [np.full(4, np.inf)] * len(Gs), 1, 2, np.arange(4), list(range(len(Gs))), "2bit")
        names = [name for name, _, _ in self.launches]
        assert names == ["tg_moments_rows", "tg_encode_rows"], names
        self.launches.clear()
        P = [random_payloads(4, int(G.shape[1]), "2bit", seed=i) for i, G in enumerate(Gs)]
        _cuda.weighted_sum_layers(P, S, [int(G.shape[1]) for G in Gs], "2bit", 4)
        assert [name for name, _, _ in self.launches] == ["tg_weighted_sum_rows"]


class TestWrapperOnGPU(_WrapperContract):
    pytestmark = needs_gpu

    def dev(self, a):
        import cupy
        return cupy.asarray(a)

    def host(self, a):
        import cupy
        assert isinstance(a, cupy.ndarray)
        return cupy.asnumpy(a)

    def test_kernels_backend_is_this_module(self):
        import cupy
        from tgsim.codecs.terngrad.kernels import get_kernels
        assert get_kernels("cuda", cupy) is _cuda
