"""The CUDA kernels on the CPU: the nvcc-built host harness and a stand-in `cupy` that runs on it.

A plain module shared by tests/test_cuda_kernels.py, tests/test_terngrad_cuda.py,
tests/test_cupy_api.py and tests/test_cuda_batched.py (`import cuda_harness`); the session fixtures
`builds` (nvcc builds
tgsim/cuda/host_harness.cu into libtg_host.so, and the PTX of the wrapper's module source) and `h`
(the loaded `Harness`) are in tests/conftest.py.

* `Harness`: ctypes calls of the tg_host_<kernel> functions, each argument checked against the
  kernel's C signature parsed from terngrad.cu (`kernel_signatures`, `host_signatures`); with
  `flush=True` the call runs with x86 FTZ+DAZ set, the float32 semantics of CuPy's -ftz=true.
* `fake_cupy(harness, launches)`: a `cupy` whose arrays are NumPy arrays, whose functions refuse the
  keywords CuPy refuses (tests/cupy_api.py) and whose RawModule kernels run on the harness, each
  launch recorded in `launches`.
* The batch-invariant model kernels (tgsim/cuda/batched.cu, tgsim/models/cuda_ops.py):
  `KERNEL_SIGS`/`HOST_SIGS` (parsed C signatures), `call_host` (a kernel's body for every logical
  thread, each argument checked), `FakeCupy` (a stand-in `cupy` whose kernels run on the batched
  harness; fixtures `batched_builds` and `fake_cp` in tests/conftest.py), and the formulas as NumPy
  loops (`loop_bmm`, `loop_sum_middle`, `same_bits`).
* Test data and front ends: `make_layer`, `random_payloads`, `corrupt` (an invalid byte or pad
  code), `assert_same_bits`, `same_float`, `ref_encode`, `ref_lanes`, `h_moments`, `h_encode`,
  `h_weighted_sum`, `h_sum_codes`.
"""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import types
from pathlib import Path

import numpy as np
import pytest

import cupy_api
from tgsim import backend
from tgsim.codecs import packing
from tgsim.codecs.terngrad import cuda as _cuda, moments as stats, quantizer as ternary
from tgsim.models import cuda_ops
from tgsim.rng import StreamKey

CUDA_DIR = Path(_cuda.__file__).resolve().parents[2] / "cuda"
NVCC = shutil.which("nvcc")
HARNESS_FLAGS = ["-O2", "-shared", "-Xcompiler", "-fPIC,-ffp-contract=off", "--fmad=false"]
NO_BAD = 2**64 - 1
LANES = stats.LANES

needs_nvcc = [
    pytest.mark.nvcc,
    pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: the CUDA kernel logic is built and run "
                                            "on the CPU with nvcc (install the CUDA toolkit)"),
]
needs_gpu = [
    pytest.mark.gpu,
    pytest.mark.skipif(not backend.gpu_available(), reason="no CUDA GPU (CuPy not installed or no device)"),
]

SIZES = [0, 1, 3, 4, 5, 19, 20, 21, 65535, 65536, 65537, 100_003]
KINDS = ["normal", "denormal", "zeros", "range", "mixed", "constant"]
KEYS = [
    StreamKey(0x0123456789ABCDEF, step=5, worker=2, layer=9),      # seed > 2^32
    StreamKey(2**64 - 1, step=2**32 - 1, worker=2**32 - 1, layer=2**32 - 1),
    StreamKey(2**32 + 7, step=1),
    StreamKey(0),
]


# ------------------------------------------------------------------------------------------------
# C signatures (parsed from the sources) and the ctypes harness
# ------------------------------------------------------------------------------------------------
_C_TYPES = {
    "float*": ("p", np.float32), "double*": ("p", np.float64), "int*": ("p", np.int32),
    "unsigned char*": ("p", np.uint8), "signed char*": ("p", np.int8),
    "unsigned int*": ("p", np.uint32), "unsigned long long*": ("p", np.uint64), "long long*": ("p", np.int64),
    "long long": ("s", np.int64), "int": ("s", np.int32), "unsigned int": ("s", np.uint32),
    "float": ("s", np.float32), "double": ("s", np.float64),
}
_CTYPES_SCALAR = {np.int64: ctypes.c_longlong, np.int32: ctypes.c_int, np.uint32: ctypes.c_uint,
                  np.float32: ctypes.c_float, np.float64: ctypes.c_double}


def _params(text: str) -> list[tuple[str, type]]:
    text = text.strip()
    if text in ("", "void"):
        return []
    out = []
    for p in text.split(","):
        m = re.fullmatch(r"(.*?)\s*(\w+)", " ".join(p.replace("*", "* ").split()))
        ctype = m.group(1).replace("const ", "").replace(" *", "*").strip()
        out.append(_C_TYPES[ctype])
    return out


def kernel_signatures() -> dict[str, list]:
    src = (CUDA_DIR / "terngrad.cu").read_text()
    return {name: _params(args)
            for name, args in re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', src)}


def host_signatures() -> dict[str, list]:
    src = (CUDA_DIR / "host_harness.cu").read_text()
    return {name: _params(args) for name, args in re.findall(r"\n\w+ (tg_host_\w+)\(([^)]*)\)", src)}


def host_name(kernel: str) -> str:
    """tg_<x> (kernel) -> tg_host_<x> (its CPU loop in host_harness.cu)."""
    assert kernel.startswith("tg_")
    return "tg_host_" + kernel[3:]


class Harness:
    """ctypes view of libtg_host.so with strict argument checking against the C signatures."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.sigs = host_signatures()
        for name, params in self.sigs.items():
            fn = getattr(self.lib, name)
            fn.argtypes = [ctypes.c_void_p if k == "p" else _CTYPES_SCALAR[t] for k, t in params]
            fn.restype = ctypes.c_int if name in ("tg_host_lanes", "tg_host_flush_denormals") else None
        self.can_flush = bool(self.lib.tg_host_flush_denormals(0))

    def call(self, name: str, *args, flush: bool = False):
        """Run tg_host_<...>(*args); flush=True runs it with denormals flushed to zero (x86 FTZ+DAZ),
        the float32 semantics of a kernel compiled with -ftz=true (what CuPy does)."""
        params = self.sigs[name]
        if len(args) != len(params):
            raise TypeError(f"{name}: {len(args)} arguments for {len(params)} parameters")
        conv = []
        for i, (a, (kind, t)) in enumerate(zip(args, params)):
            if kind == "p":
                if not isinstance(a, np.ndarray) or a.dtype != t or not a.flags.c_contiguous:
                    raise TypeError(f"{name} argument {i}: expected a contiguous {np.dtype(t)} array, got "
                                    f"{type(a).__name__} {getattr(a, 'dtype', '')}")
                conv.append(a.ctypes.data)
            else:
                if type(a) is not t:   # Python int/float would reach the kernel as long long/double
                    raise TypeError(f"{name} argument {i}: expected numpy.{np.dtype(t)}, got {type(a).__name__}")
                conv.append(_CTYPES_SCALAR[t](a.item()))   # converted now, before any MXCSR change
        if not flush:
            return getattr(self.lib, name)(*conv)
        if not self.can_flush:
            pytest.skip("no x86 MXCSR: cannot emulate flush-to-zero")
        self.lib.tg_host_flush_denormals(1)
        try:
            return getattr(self.lib, name)(*conv)
        finally:
            self.lib.tg_host_flush_denormals(0)


def make_layer(kind: str, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng([seed, n, KINDS.index(kind)])
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    if kind == "normal":
        g = rng.standard_normal(n) * 1e-2
    elif kind == "denormal":   # half denormals (all 23 mantissa bits), half tiny normals
        bits = rng.integers(1, 2**23, n, dtype=np.uint32)
        g = bits.view(np.float32).astype(np.float64) * sign
        tiny = rng.random(n) < 0.5
        g[tiny] = sign[tiny] * rng.uniform(1.2e-38, 1e-37, int(tiny.sum()))
    elif kind == "zeros":
        g = 0.0 * sign                                   # +0.0 and -0.0
    elif kind == "range":      # exponents across the whole float32 range
        g = sign * np.exp2(rng.uniform(-149.0, 127.9, n))
    elif kind == "mixed":      # normal bulk, exact zeros, huge outliers, denormals
        g = rng.standard_normal(n)
        u = rng.random(n)
        g[u < 0.1] = 0.0
        g[(u >= 0.1) & (u < 0.12)] *= 1e30
        g[(u >= 0.12) & (u < 0.14)] = 1e-40
    elif kind == "constant":
        g = np.full(n, 0.375)
    else:
        raise ValueError(kind)
    with np.errstate(over="ignore"):
        g = g.astype(np.float32)
    g[~np.isfinite(g)] = np.float32(3.0e38)
    return g


def bits(a) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(a))
    return a.view({4: np.uint32, 8: np.uint64, 1: np.uint8, 2: np.uint16}[a.dtype.itemsize])


def assert_same_bits(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    bad = np.flatnonzero(bits(actual) != bits(expected))
    assert bad.size == 0, (f"{bad.size} of {actual.size} differ; first at {bad[0]}: "
                           f"{actual[bad[0]]!r} vs {expected[bad[0]]!r}")


def f64bits(x: float) -> int:
    return int(np.float64(x).view(np.uint64))


def same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or f64bits(a) == f64bits(b)


def scalings(g: np.ndarray):
    m = stats.layer_moments(g, need_sigma=True)
    return {c: ternary.scaling_from_moments(m.absmax, m.sigma, c, 2.5) for c in ternary.CLIP_MODES}


def ref_encode(g, s, cb, key, fmt):
    return packing.pack(ternary.ternarize(g, s, key, cb), fmt)


def ref_lanes(g):
    """stats.lane_sums' lanes before the tree (same loop)."""
    n = g.size
    k = np.float64(g[0]) if n else np.float64(0.0)
    s1, s2 = np.zeros(LANES), np.zeros(LANES)
    for r0 in range(0, n, LANES):
        d = g[r0:r0 + LANES].astype(np.float64) - k
        s1[:d.size] += d
        s2[:d.size] += d * d
    return s1, s2


def random_payloads(workers: int, n: int, fmt: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng([seed, workers, n])
    nb = packing.packed_size(n, fmt)
    out = np.empty((workers, nb), dtype=np.uint8)
    for w in range(workers):
        out[w] = packing.pack(rng.integers(-1, 2, n).astype(np.int8), fmt)
    return out


SCALER_SETS = {
    "distinct": [1.0, 0.1, 0.0, 1e-45, 3.0e38, -2.5, 7.25e-3, 65504.0],
    "shared": [0.0123] * 8,
}


def scalers_for(kind: str, workers: int) -> np.ndarray:
    return np.array(SCALER_SETS[kind][:workers], dtype=np.float32)


# harness front ends: same arguments as the kernels, host arrays
def h_moments(h, g):
    s1, s2 = np.full(LANES, np.nan), np.full(LANES, np.nan)
    amax, bad = np.full(LANES, np.nan, dtype=np.float32), np.zeros(1, dtype=np.int32)
    h.call("tg_host_moments_lanes", g, np.int64(g.size), s1, s2, amax, bad)
    lanes = (s1.copy(), s2.copy(), amax.copy())
    h.call("tg_host_moments_tree", s1, s2, amax, np.int32(LANES))
    return lanes, (float(s1[0]), float(s2[0]), float(amax[0])), int(bad[0])


def h_encode(h, g, s, cb, key, fmt):
    out = np.full(packing.packed_size(g.size, fmt), 0xFF, dtype=np.uint8)   # 0xFF: invalid in both formats
    k0, k1 = key.key
    h.call(f"tg_host_encode_{fmt}", g, np.int64(g.size), np.float32(s), np.float32(cb), np.uint32(k0),
           np.uint32(k1), np.uint32(key.layer), np.uint32(key.worker), np.uint32(key.step), out)
    return out


def h_weighted_sum(h, payloads, scalers, n, fmt, divide_by):
    out = np.full(n, np.nan, dtype=np.float32)
    first_bad = np.array([NO_BAD], dtype=np.uint64)
    h.call("tg_host_weighted_sum", np.ascontiguousarray(payloads), np.int32(payloads.shape[0]),
           np.int64(payloads.shape[1]), np.ascontiguousarray(scalers, dtype=np.float32), np.int64(n),
           np.int32(_cuda.FMT_CODE[fmt]), np.float64(1.0 / divide_by), out, first_bad)
    return out, int(first_bad[0])


def h_sum_codes(h, payloads, n, fmt):
    out = np.full(n, -99, dtype=np.int32)
    first_bad = np.array([NO_BAD], dtype=np.uint64)
    h.call("tg_host_sum_codes", np.ascontiguousarray(payloads), np.int32(payloads.shape[0]),
           np.int64(payloads.shape[1]), np.int64(n), np.int32(_cuda.FMT_CODE[fmt]), out, first_bad)
    return out, int(first_bad[0])


def corrupt(fmt: str, p: np.ndarray, n: int, w: int, b: int, what: str):
    """Make byte b of worker w invalid: "code" (0b11 / > 242) or "pad" (non-zero pad code)."""
    if what == "code":
        p[w, b] = (p[w, b] | 0b11 << 4) if fmt == "2bit" else 243 + (b % 13)
        return
    k = packing.CODES_PER_BYTE[fmt]
    m = n - b * k                     # first pad position in byte b
    assert b == p.shape[1] - 1 and 0 < m < k
    codes = packing.LUT[fmt][0][p[w, b]].astype(np.int64)
    codes[m] = 1
    p[w, b] = (sum((c + 1) << 2 * i for i, c in enumerate(codes)) if fmt == "2bit"
               else sum((c + 1) * 3**i for i, c in enumerate(codes)))


class _FakeKernel:
    def __init__(self, harness: Harness, name: str, launches: list, flush: bool):
        self.harness, self.name, self.launches, self.flush = harness, name, launches, flush

    def __call__(self, grid, block, args, **kwargs):
        assert isinstance(grid, tuple) and isinstance(block, tuple) and isinstance(args, tuple)
        assert grid[0] >= 1 and 1 <= block[0] <= 1024 and grid[0] < 2**31
        if self.name == "tg_moments_tree":
            assert grid == (1,), "the tree kernel needs one block"
        if self.name == "tg_moments_rows":
            assert block == (_cuda.ROW_THREADS,), "tg_moments_rows needs TG_ROW_THREADS threads a block"
        self.launches.append((self.name, grid, block))
        self.harness.call(host_name(self.name), *args, flush=self.flush)


def fake_cupy(harness: Harness, launches: list) -> types.ModuleType:
    """A `cupy` whose arrays are NumPy arrays and whose RawModule kernels run on the harness.

    Its functions are NumPy's wrapped by cupy_api.strict: a keyword real CuPy does not accept is a
    TypeError here too, where NumPy would accept it."""
    cp = types.ModuleType("cupy")
    for name in ("ndarray", "float32", "float64", "int8", "int16", "int32", "uint8", "uint64"):
        setattr(cp, name, getattr(np, name))
    for name in ("asarray", "ascontiguousarray", "empty", "zeros", "full", "stack", "concatenate", "isnan"):
        setattr(cp, name, cupy_api.strict(getattr(np, name), name))
    cp.asnumpy = cupy_api.strict(lambda a, stream=None, order="C", out=None, blocking=True:
                                 np.array(a, copy=True), "asnumpy")

    class RawModule:
        def __init__(self, code=None, options=(), **kwargs):
            unknown = set(kwargs) - set(cupy_api.API["RawModule"])
            if unknown:
                raise TypeError(f"RawModule() got unexpected keyword arguments {sorted(unknown)} (CuPy)")
            assert code == _cuda.source() and "-fmad=false" in options
            self.kernels = kernel_signatures()
            self.flush = cupy_api.effective_ftz(options)   # as CuPy compiles it: -ftz=true

        def get_function(self, name):
            assert name in self.kernels, name
            return _FakeKernel(harness, name, launches, self.flush)

    cp.RawModule = RawModule
    return cp


# ------------------------------------------------------------------------------------------------
# the batch-invariant model kernels (tgsim/cuda/batched.cu): signatures and ctypes
# ------------------------------------------------------------------------------------------------
def _signatures(path: Path, prefix: str) -> dict[str, list[str]]:
    """name -> C parameter types of every `prefix...(` function defined by the macros in `path`,
    expanded for both suffixes (the sources define each body once, for float and double)."""
    src = path.read_text()
    out = {}
    for name, params in re.findall(rf"(?:void|__global__ void) ({prefix}\w+)##SUF\(([^)]*)\)", src.replace("\\\n", " ")):
        for suf, t in (("f32", "float"), ("f64", "double")):
            out[name + suf] = [" ".join(p.replace("T*", t + "*").split()[:-1]).replace("const ", "")
                               for p in params.split(",")]
    return out


KERNEL_SIGS = _signatures(CUDA_DIR / "batched.cu", "tgb_")
HOST_SIGS = _signatures(CUDA_DIR / "batched_harness.cu", "tgb_host_")
_PTR = {"float*": np.float32, "double*": np.float64}


def call_host(lib, kernel: str, args) -> None:
    """Run kernel `kernel`'s body for every logical thread (tgb_host_<...>), checking every argument
    against the kernel's C signature: arrays of the pointer's element type, numpy.int64 scalars."""
    sig = KERNEL_SIGS[kernel]
    assert HOST_SIGS["tgb_host_" + kernel[4:]] == sig
    assert len(args) == len(sig), (kernel, len(args), len(sig))
    conv = []
    for i, (a, t) in enumerate(zip(args, sig)):
        if t in _PTR:
            assert isinstance(a, np.ndarray) and a.dtype == _PTR[t], (kernel, i, type(a), getattr(a, "dtype", None))
            conv.append(ctypes.c_void_p(a.ctypes.data))     # the view's first element, as a.data.ptr in CuPy
        else:
            assert t == "long long" and type(a) is np.int64, (kernel, i, t, type(a))
            conv.append(ctypes.c_longlong(int(a)))
    getattr(lib, "tgb_host_" + kernel[4:])(*conv)


# ------------------------------------------------------------------------------------------------
# the formula, written with NumPy elementwise operations (one rounding per product and per sum)
# ------------------------------------------------------------------------------------------------
def loop_bmm(a, b):
    n, m, k = a.shape
    bb = np.broadcast_to(b, (n,) + b.shape[-2:])
    acc = np.zeros((n, m, b.shape[-1]), a.dtype)
    for j in range(k):
        acc = acc + a[:, :, j:j + 1] * bb[:, j:j + 1, :]
    return acc


def loop_sum_middle(x):
    o, r, p = x.shape
    if r == 0:
        return np.zeros((o, p), x.dtype)
    acc = x[:, 0, :].copy()
    for j in range(1, r):
        acc = acc + x[:, j, :]
    return acc


def same_bits(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# ------------------------------------------------------------------------------------------------
# a stand-in CuPy: NumPy arrays, CuPy's accepted keywords, kernels on the harness
# ------------------------------------------------------------------------------------------------
class FakeCupy(types.ModuleType):
    """`cupy` for the CPU: attributes of NumPy, each function wrapped by cupy_api.strict (a name or
    keyword CuPy lacks raises, as CuPy would), and a RawModule whose kernels run on the harness."""

    DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
              "uint32", "uint64", "bool_", "ndarray"}

    def __init__(self, lib, launches: list):
        super().__init__("cupy")
        self._lib, self._launches = lib, launches
        outer = self

        class RawModule:
            def __init__(self, code=None, options=(), **kwargs):
                assert not set(kwargs) - set(cupy_api.API["RawModule"])
                assert code == cuda_ops.CUDA_FILE.read_text() and "-fmad=false" in options
                self.kernels = set(KERNEL_SIGS)

            def get_function(self, name):
                assert name in self.kernels, name

                def launch(grid, block, args, **kw):
                    assert isinstance(grid, tuple) and isinstance(block, tuple) and isinstance(args, tuple)
                    assert 1 <= grid[0] <= cuda_ops.MAX_GRID and block == (cuda_ops.BLOCK,)
                    outer._launches.append(name)
                    call_host(outer._lib, name, args)
                return launch

        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(      # what the trainer's manifest asks of the device
            Device=lambda device=None: types.SimpleNamespace(id=0, synchronize=lambda: None),
            runtime=types.SimpleNamespace(getDeviceProperties=lambda device: {"name": b"stand-in (harness)"}))

    def __getattr__(self, name):
        if name in self.DTYPES:
            return getattr(np, name)
        if name.startswith("__"):
            raise AttributeError(name)
        return cupy_api.strict(getattr(np, name), name)
