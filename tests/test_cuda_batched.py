"""The batch-invariant model kernels (tgsim/cuda/batched.cu, tgsim/models/cuda_ops.py), without a GPU.

Issue 23: on an H100 a worker's loss computed in a batch of 3 workers differed from its loss alone,
because cupy.matmul and CuPy's reductions pick their blocking from the whole shape. The models now
do every product and every sum over the batch on CuPy with these kernels. Here (marker `nvcc`):
  * nvcc builds tgsim/cuda/batched_harness.cu (the kernels' own __host__ __device__ bodies, run for
    every logical thread) and the PTX of batched.cu with the options CuPy compiles it with;
  * the bodies equal a NumPy loop of the formula (k ascending from +0.0, each product and sum
    rounded), bit for bit, on strided views and shared or per-worker matrices, float32 and float64;
  * the wrapper runs against a stand-in `cupy` whose functions are NumPy's, refusing what CuPy
    refuses (tests/cupy_api.py), and whose kernels dispatch to the harness; through it every model's
    loss_and_grad takes the CuPy route (cuda_ops.bmm / sum_axis): a worker's loss and gradients in
    a batch of N = 3 and 8 equal its own N = 1 call bit for bit, and the NumPy route within 1e-5.
What only a GPU shows (tests/test_models.py::test_cupy_matches_numpy, marker `gpu`): the device
compile and launch, and FTZ on float32 denormals (the harness computes without it).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tgsim.models import base as model_base, cuda_ops, make_model

from cuda_harness import HOST_SIGS, KERNEL_SIGS, NVCC, loop_bmm, loop_sum_middle, same_bits
DTYPES = [np.float32, np.float64]

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: the CUDA kernel logic is built and run "
                                            "on the CPU with nvcc (install the CUDA toolkit)"),
]


# ------------------------------------------------------------------------------------------------
# the kernels' bodies
# ------------------------------------------------------------------------------------------------
def test_every_kernel_has_a_host_loop_and_compiles_without_fma(batched_builds):
    assert set(KERNEL_SIGS) == set(cuda_ops.KERNELS)
    assert {"tgb_host_" + k[4:] for k in KERNEL_SIGS} == set(HOST_SIGS)
    entries = set(re.findall(r"\.entry (\w+)\(", batched_builds.ptx))
    assert entries == set(cuda_ops.KERNELS)
    assert not re.search(r"\bfma\.", batched_builds.ptx), "a product and a sum were fused: the order of rounding changed"


def _operands(rng, dtype, n, m, k, p, kind):
    """a (n, m, k) and b as the models pass them: contiguous, a swapaxes view, a shared or per-worker b,
    a transposed view of b, empty K."""
    a = rng.standard_normal((n, m, k)).astype(dtype)
    if kind == "a_view":                       # dense_backward's dw = swapaxes(h) @ d
        a = np.swapaxes(rng.standard_normal((n, k, m)).astype(dtype), 1, 2)
    b = rng.standard_normal((n, k, p) if kind == "per_worker" else (k, p)).astype(dtype)
    if kind == "b_view":                       # w.T of a large weight
        b = rng.standard_normal((p, k)).astype(dtype).T
    return a, b


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["shared", "per_worker", "a_view", "b_view"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 8, 40, 17), (2, 5, 0, 3), (4, 320, 7, 9)])
def test_bmm_body_is_the_ordered_loop(batched_builds, fake_cp, dtype, kind, shape):
    rng = np.random.default_rng([7, *shape])
    a, b = _operands(rng, dtype, *shape, kind)
    got = cuda_ops.bmm(a, b)
    assert got.flags.c_contiguous
    assert same_bits(got, loop_bmm(a, b))
    # and it is a product: within rounding of float64 matmul
    np.testing.assert_allclose(got, np.matmul(a.astype(np.float64), b.astype(np.float64)),
                               rtol=1e-4 if dtype == np.float32 else 1e-12, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 8, 17), (5, 0, 4), (2, 320, 1), (6, 1, 3)])
def test_sum_middle_body_is_the_ordered_loop(batched_builds, fake_cp, dtype, shape):
    x = np.random.default_rng([8, *shape]).standard_normal(shape).astype(dtype)
    x[0, ..., 0] = -0.0                       # a lone -0.0 stays -0.0 (R = 1), and sums as the loop does
    got = cuda_ops.sum_middle(x)
    assert same_bits(got, loop_sum_middle(x))


def test_sum_axis_moves_the_axis(batched_builds, fake_cp):
    x = np.random.default_rng(9).standard_normal((3, 4, 5, 6)).astype(np.float32)
    for axis in (0, 1, 2, 3, -1):
        want = np.moveaxis(x, axis, 1)
        want = loop_sum_middle(want.reshape(want.shape[0], want.shape[1], -1)).reshape(
            np.delete(np.array(x.shape), axis % 4))
        assert same_bits(cuda_ops.sum_axis(x, axis), want), axis


def test_one_worker_in_any_batch_has_its_own_bits(batched_builds, fake_cp):
    """The claim itself, on the kernels: rows of worker i are the same for N = 1, 3, 8."""
    rng = np.random.default_rng(10)
    a = rng.standard_normal((8, 8, 256)).astype(np.float32)
    b = rng.standard_normal((8, 256, 64)).astype(np.float32)
    full_prod, full_sum = cuda_ops.bmm(a, b), cuda_ops.sum_middle(a)
    for n in (1, 3):
        for i in range(0, 8 - n + 1, 3):
            assert same_bits(cuda_ops.bmm(a[i:i + n], b[i:i + n]), full_prod[i:i + n])
            assert same_bits(cuda_ops.sum_middle(a[i:i + n]), full_sum[i:i + n])


def test_argument_errors(batched_builds, fake_cp):
    f32 = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(TypeError, match="float32 or float64"):
        cuda_ops.bmm(f32, np.zeros((4, 5), np.float64))
    with pytest.raises(TypeError, match="float32 or float64"):
        cuda_ops.sum_middle(np.zeros((2, 3, 4), np.int32))
    with pytest.raises(ValueError, match="do not multiply"):
        cuda_ops.bmm(f32, np.zeros((5, 5), np.float32))
    with pytest.raises(ValueError, match="do not multiply"):
        cuda_ops.bmm(f32, np.zeros((3, 4, 5), np.float32))
    with pytest.raises(ValueError, match=r"\(N, M, K\)"):
        cuda_ops.bmm(f32[0], np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match=r"\(O, R, P\)"):
        cuda_ops.sum_middle(f32[0])


def test_negative_strides_are_copied_first(batched_builds, fake_cp):
    rng = np.random.default_rng(11)
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)[:, ::-1, :]
    b = rng.standard_normal((4, 5)).astype(np.float32)[:, ::-1]
    assert same_bits(cuda_ops.bmm(a, b), loop_bmm(a, b))


# ------------------------------------------------------------------------------------------------
# the models through the CuPy route
# ------------------------------------------------------------------------------------------------
MODELS = {
    "least_squares": ("least_squares", {"dim": 12, "l2": 1e-3}),
    "logistic": ("logistic", {"dim": 12}),
    "softmax": ("softmax", {"dim": 12, "classes": 5}),
    "mlp": ("mlp", {"dim": 12, "hidden": (16, 16), "classes": 5}),
    "convnet1d": ("convnet1d", {"length": 20, "channels": (4, 6), "hidden": 8, "classes": 5}),
}


def _data(model, n, bsz, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, bsz, *model.feature_shape)).astype(np.float32)
    if model.task == "regression":
        y = rng.standard_normal((n, bsz)).astype(np.float32)
    else:
        y = rng.integers(0, 2 if model.head == "logistic" else model.classes, (n, bsz))
    return x, y


@pytest.fixture
def cupy_route(fake_cp, monkeypatch):
    """The models see every array as a CuPy array of the stand-in (xp = fake_cp)."""
    monkeypatch.setattr(model_base, "array_module", lambda x: fake_cp)
    return fake_cp


@pytest.mark.parametrize("key", list(MODELS))
def test_models_on_the_cupy_route_are_batch_invariant(cupy_route, key):
    name, opts = MODELS[key]
    model = make_model(name, **opts)
    params = model.init(4)
    x, y = _data(model, 8, 6)
    launches = cupy_route._launches
    loss, grads = model.loss_and_grad(params, x, y)
    assert any(k.startswith("tgb_bmm") for k in launches) and any(k.startswith("tgb_sum") for k in launches)
    for n in (1, 3):
        for i in (0, 8 - n):
            li, gi = model.loss_and_grad(params, x[i:i + n], y[i:i + n])
            assert same_bits(np.asarray(li), np.asarray(loss[i:i + n])), (key, n, i)
            for k in grads:
                assert same_bits(gi[k], grads[k][i:i + n]), (key, k, n, i)


@pytest.mark.parametrize("key", list(MODELS))
def test_models_on_the_cupy_route_agree_with_numpy(batched_builds, fake_cp, monkeypatch, key):
    name, opts = MODELS[key]
    model = make_model(name, **opts)
    params = model.init(5)
    x, y = _data(model, 3, 7, seed=1)
    loss, grads = model.loss_and_grad(params, x, y)                 # NumPy route
    monkeypatch.setattr(model_base, "array_module", lambda a: fake_cp)
    lc, gc = model.loss_and_grad(params, x, y)
    np.testing.assert_allclose(lc, loss, rtol=1e-5)
    for k in grads:
        np.testing.assert_allclose(gc[k], grads[k], rtol=1e-4, atol=1e-6)
