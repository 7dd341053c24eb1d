"""Every CuPy call in tgsim uses only names and keywords CuPy accepts (tests/cupy_api.py).

Static (ast) scan of tgsim/**/*.py, no GPU needed: a call `xp.<name>(...)`, `cp.<name>(...)`,
`cupy.<name>(...)` or `<module>().<name>(...)` where <module> is `_cp`, `get_xp` or `array_module`
is checked against cupy_api.API: an unknown name, a keyword CuPy does not accept, `**kwargs` (cannot
be checked), or a keyword whose value CuPy does not implement (cupy_api.NOT_IMPLEMENTED) is a
finding. Issue 23: `xp.unpackbits(payload, count=...)` raised TypeError on an H100 and nothing on
the CPU saw it; the positive controls below show the scan flags exactly that call.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import cupy_api

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "tgsim"
MODULE_NAMES = {"xp", "cp", "cupy"}
MODULE_FUNCS = {"_cp", "get_xp", "array_module", "_cupy"}

# Findings already known and reported (issue 23), as (path, name, keyword). A fix makes the entry
# stale, which fails test_tgsim_calls_only_what_cupy_accepts: remove it then.
KNOWN: set[tuple[str, str, str]] = set()     # none left: sign.py's packbits(axis=-1) was rewritten


def _dotted(node) -> tuple[str, ast.AST] | None:
    """('linalg.solve', root) for xp.linalg.solve; None unless the chain starts at an array module."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not parts:
        return None
    if isinstance(node, ast.Name) and node.id in MODULE_NAMES:
        return ".".join(reversed(parts)), node
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in MODULE_FUNCS:
        return ".".join(reversed(parts)), node
    return None


def _literal(node):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return False, None


def scan_source(text: str, path: str = "<snippet>") -> list[tuple[str, int, str, str, str]]:
    """Findings (path, line, name, keyword or '', why) for the CuPy-capable calls in `text`."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call):
            continue
        hit = _dotted(node.func)
        if hit is None:
            continue
        name = hit[0]
        if name not in cupy_api.API:
            found.append((path, node.lineno, name, "", "not in tests/cupy_api.API (check CuPy's docs)"))
            continue
        for kw in node.keywords:
            if kw.arg is None:
                found.append((path, node.lineno, name, "**", "**kwargs cannot be checked"))
            elif kw.arg not in cupy_api.API[name]:
                found.append((path, node.lineno, name, kw.arg, "keyword CuPy does not accept"))
            elif (name, kw.arg) in cupy_api.NOT_IMPLEMENTED:
                ok, value = _literal(kw.value)
                if not ok or value is not cupy_api.NOT_IMPLEMENTED[(name, kw.arg)]:
                    found.append((path, node.lineno, name, kw.arg,
                                  f"CuPy raises NotImplementedError unless it is "
                                  f"{cupy_api.NOT_IMPLEMENTED[(name, kw.arg)]!r}"))
    return found


def scan_tree() -> list[tuple[str, int, str, str, str]]:
    found = []
    for p in sorted(SOURCES.rglob("*.py")):
        found += scan_source(p.read_text(), str(p.relative_to(ROOT)))
    return found


def test_tgsim_calls_only_what_cupy_accepts():
    found = scan_tree()
    new = [f for f in found if (f[0], f[2], f[3]) not in KNOWN]
    assert not new, "CuPy would refuse these calls:\n" + "\n".join(
        f"  {p}:{line}: xp.{name}({kw + '=' if kw else ''}...): {why}" for p, line, name, kw, why in new)
    stale = KNOWN - {(f[0], f[2], f[3]) for f in found}
    assert not stale, f"fixed, remove from KNOWN: {sorted(stale)}"


def test_the_scan_sees_calls_in_tgsim():
    """The scan is not vacuous: it visits the calls this test was written against."""
    names = set()
    for p in sorted(SOURCES.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and (hit := _dotted(node.func)):
                names.add(hit[0])
    assert {"unpackbits", "packbits", "asarray", "RawModule", "empty"} <= names, sorted(names)


# -- positive controls ------------------------------------------------------------------------------
@pytest.mark.parametrize("snippet, name, kw", [
    ("bits = xp.unpackbits(a, count=3)", "unpackbits", "count"),                  # issue 23
    ("bits = xp.unpackbits(a, count=n * w, bitorder='little')", "unpackbits", "count"),
    ("p = xp.packbits(bits, axis=-1, bitorder='little')", "packbits", "axis"),   # NotImplementedError
    ("s = xp.minimum(a, b, where=m)", "minimum", "where"),                        # NumPy-only ufunc kw
    ("t = xp.take(a, i, mode='clip')", "take", "mode"),
    ("y = xp.asarray(a, like=b)", "asarray", "like"),
    ("y = cp.zeros(3, **kw)", "zeros", "**"),
    ("m = _cp().RawModule(code=src, options=o, log_stream=s)", "RawModule", "log_stream"),
    ("s = array_module(g).nanmean(g)", "nanmean", ""),                            # unknown name
])
def test_scan_flags_what_cupy_refuses(snippet, name, kw):
    found = scan_source(snippet)
    assert [(f[2], f[3]) for f in found] == [(name, kw)], found


def test_scan_passes_what_cupy_accepts():
    ok = """
bits = xp.unpackbits(payload, bitorder="little")[: n * w]
p = xp.packbits(bits.reshape(-1), bitorder="little")
q = xp.packbits(bits, axis=None)
m = _cp().RawModule(code=src, options=("-fmad=false",))
e = cp.empty(4, dtype=cp.float32)
x = np.unpackbits(a, count=3)          # NumPy itself: not a CuPy path
y = xp.abs(v, out=v)
"""
    assert scan_source(ok) == []


# -- the stand-in CuPy refuses what CuPy refuses ----------------------------------------------------
def test_strict_wrapper_raises_like_cupy():
    a = np.array([5, 255], dtype=np.uint8)
    unpack = cupy_api.strict(np.unpackbits, "unpackbits")
    assert (unpack(a, bitorder="little") == np.unpackbits(a, bitorder="little")).all()
    with pytest.raises(TypeError, match="unexpected keyword argument 'count'"):
        unpack(a, count=3)
    with pytest.raises(NotImplementedError):
        cupy_api.strict(np.packbits, "packbits")(a, axis=0)
    with pytest.raises(KeyError):
        cupy_api.strict(np.nanmean, "nanmean")


def test_stand_in_cupy_is_strict():
    import cuda_harness as tck

    cp = tck.fake_cupy(None, [])
    assert cp.empty(3, dtype=cp.float32).dtype == np.float32
    assert cp.zeros((2, 2), dtype=cp.int32, order="C").shape == (2, 2)
    with pytest.raises(TypeError, match="like"):
        cp.asarray([1.0], like=np.zeros(1))
    with pytest.raises(TypeError, match="where"):
        cp.isnan(np.zeros(2), where=np.ones(2, bool))
    with pytest.raises(TypeError, match="subok"):
        cp.ascontiguousarray(np.zeros(2), subok=True)
    for name in vars(cp):
        if callable(getattr(cp, name)) and not isinstance(getattr(cp, name), type):
            assert name in cupy_api.API, f"stand-in cupy.{name} is not in tests/cupy_api.API"


# -- CuPy compiles every RawModule with -ftz=true (cupy_api.APPENDED_OPTIONS) ----------------------
# The kernels must give the reference's bits anyway: no float32 instruction (the PTX test in
# test_cuda_kernels.py), and the same host bodies give the reference's bits with x86 FTZ+DAZ set,
# the float32 semantics of -ftz=true. Denormal inputs and signed zeros are what issue 23's H100 run
# got wrong (sigma, packed bytes, 0.0 for -0.0).
from cuda_harness import (KEYS, NO_BAD, assert_same_bits, make_layer,  # noqa: E402
                          random_payloads, ref_encode, scalings)
from tgsim.codecs import packing  # noqa: E402
from tgsim.codecs.terngrad import moments as stats  # noqa: E402


def test_cupy_appends_ftz_true():
    from tgsim.codecs.terngrad import cuda as _cuda
    assert cupy_api.effective_ftz(_cuda.NVRTC_OPTIONS)          # our -ftz=false does not survive
    assert cupy_api.effective_options(("-fmad=false", "-ftz=false")) == ["-fmad=false", "-ftz=true"]


def _floats() -> np.ndarray:
    """Every denormal float32 (both signs, and ±0), 2^20 random bit patterns, and the edges."""
    sub = np.arange(0, 2**23, dtype=np.uint32)
    other = np.random.default_rng(0).integers(0, 2**32, 2**20, dtype=np.uint64).astype(np.uint32)
    special = np.array([0x7F800000, 0x00800000, 0x7F7FFFFF, 0x7FC00000, 0x7FA00001], dtype=np.uint32)
    u = np.concatenate([sub, sub | np.uint32(1 << 31), other, special, special | np.uint32(1 << 31)])
    return u.view(np.float32)


@pytest.mark.nvcc
@pytest.mark.parametrize("flush", [False, True])
def test_f2d_is_exact_for_every_float(h, flush):
    f = _floats()
    out = np.empty(f.size)
    h.call("tg_host_f2d", np.int64(f.size), f, out, flush=flush)
    nan = np.isnan(f)
    assert_same_bits(out[~nan], f[~nan].astype(np.float64))
    assert np.isnan(out[nan]).all()


@pytest.mark.nvcc
@pytest.mark.parametrize("flush", [False, True])
def test_d2f_rounds_like_numpy(h, flush):
    rng = np.random.default_rng(1)
    n = 2**20
    d = np.ldexp(rng.random(n) * 0.5 + 0.5, rng.integers(-1100, 1025, n)) * np.where(rng.random(n) < 0.5, -1, 1)
    f = _floats()[::37]
    f = f[np.isfinite(f)].astype(np.float64)
    half_ulp = np.maximum(np.ldexp(1.0, np.frexp(f)[1] - 25), 2.0**-150)   # ties between neighbours
    big = 3.4028234663852886e38                                           # largest float32
    edges = np.array([2.0**-150, 3 * 2.0**-151, 2.0**-126 - 2.0**-150, big * (1 + 2.0**-25),
                      big + 2.0**103, np.inf, 0.0, 5e-324, 2.0**-1022, np.nan])
    x = np.concatenate([d, f, f + half_ulp, f - half_ulp, edges, -edges])
    out = np.empty(x.size, dtype=np.float32)
    h.call("tg_host_d2f", np.int64(x.size), x, out, flush=flush)
    with np.errstate(all="ignore"):
        ref = x.astype(np.float32)
    assert_same_bits(out, ref)


@pytest.mark.nvcc
def test_kernels_under_flush_to_zero(h):
    """Moments, encode and weighted sum on denormals, run with FTZ+DAZ set: the reference's bits
    (the same data gave issue 23's H100 failures, and gives them here with the old kernels)."""
    g = make_layer("denormal", 65537, seed=5)
    s1, s2 = np.full(stats.LANES, np.nan), np.full(stats.LANES, np.nan)
    amax, bad = np.full(stats.LANES, np.nan, dtype=np.float32), np.zeros(1, dtype=np.int32)
    h.call("tg_host_moments_lanes", g, np.int64(g.size), s1, s2, amax, bad, flush=True)
    h.call("tg_host_moments_tree", s1, s2, amax, np.int32(stats.LANES), flush=True)
    _, e1, e2 = stats.lane_sums(g)
    assert (s1[0], s2[0], amax[0]) == (e1, e2, stats.layer_moments(g).absmax)
    k0, k1 = KEYS[0].key
    for sc in scalings(g).values():
        for fmt in packing.FORMATS:
            out = np.full(packing.packed_size(g.size, fmt), 0xFF, dtype=np.uint8)
            h.call(f"tg_host_encode_{fmt}", g, np.int64(g.size), np.float32(sc.scaler), np.float32(sc.clip_bound),
                   np.uint32(k0), np.uint32(k1), np.uint32(KEYS[0].layer), np.uint32(KEYS[0].worker),
                   np.uint32(KEYS[0].step), out, flush=True)
            assert_same_bits(out, ref_encode(g, sc.scaler, sc.clip_bound, KEYS[0], fmt))
    p = random_payloads(5, 65537, "2bit", seed=7)
    s = np.array([1.0, 0.1, 0.0, 1e-45, 3.0e38], dtype=np.float32)      # 1e-45: a denormal scaler
    out = np.full(65537, np.nan, dtype=np.float32)
    first_bad = np.array([NO_BAD], dtype=np.uint64)
    h.call("tg_host_weighted_sum", p, np.int32(5), np.int64(p.shape[1]), s, np.int64(65537), np.int32(0),
           np.float64(1.0 / 3), out, first_bad, flush=True)
    with np.errstate(all="ignore"):
        ref = packing.weighted_sum(p, s, 65537, "2bit", 3)
    assert ((ref == 0) & np.signbit(ref)).sum() > 100                  # the data has -0.0 results
    assert (np.signbit(out) == np.signbit(ref)).all()
    assert_same_bits(out, ref)
