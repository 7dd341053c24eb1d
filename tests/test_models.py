"""tgsim.models: gradients (finite differences in float64), bitwise per-worker independence, the
least-squares optimum, shapes/dtypes, init determinism, evaluation, the registry, and a training
sanity check."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import central_difference_error
from tgsim.backend import gpu_available
from tgsim.models import (MODELS, MLP, ConvNet1D, LeastSquares, LogisticRegression, SoftmaxRegression,
                          make_model)
from tgsim.models import base as mbase
from tgsim.models._numba_bmm import matmul_workers

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    threadpool_limits = None


def make_data(model, n, b, seed=0, dtype=np.float32):
    rng = np.random.default_rng([seed, 77])
    x = rng.standard_normal((n, b, *model.feature_shape)).astype(dtype)
    if model.task == "regression":
        y = rng.standard_normal((n, b)).astype(dtype)
    else:
        y = rng.integers(0, model.num_classes, size=(n, b)).astype(np.int64)
    return x, y


# small instances for the gradient checks (float64), realistic ones for the bitwise checks
SMALL = {
    "least_squares": LeastSquares(dim=6, l2=0.3),
    "least_squares_nobias": LeastSquares(dim=5, l2=0.0, bias=False),
    "logistic": LogisticRegression(dim=7, l2=0.05),
    "softmax": SoftmaxRegression(dim=6, classes=4, l2=0.1),
    "mlp": MLP(dim=7, hidden=(9, 8), classes=5, l2=0.01),
    "mlp_nohidden": MLP(dim=5, hidden=(), classes=3),
    "convnet1d": ConvNet1D(length=16, channels=(3, 4), kernel=5, hidden=6, classes=4, l2=0.02),
    "convnet1d_valid_odd": ConvNet1D(length=23, channels=(2, 3), kernel=4, hidden=5, classes=3, padding="valid"),
}

REALISTIC = {
    "least_squares": LeastSquares(dim=40, l2=0.1),
    "logistic": LogisticRegression(dim=40, l2=0.01),
    "softmax": SoftmaxRegression(dim=40, classes=10, l2=0.01),
    "mlp": MLP(dim=40, hidden=(256, 256), classes=10),
    "convnet1d": ConvNet1D(),
}


def as64(params):
    return {k: v.astype(np.float64) for k, v in params.items()}


# ---------------------------------------------------------------------------------------------
# gradients


@pytest.mark.parametrize("key", list(SMALL))
def test_gradient_matches_finite_differences_float64(key):
    model = SMALL[key]
    rng = np.random.default_rng(123)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in as64(model.init(3)).items()}
    x, y = make_data(model, 2, 5, seed=1, dtype=np.float64)
    loss, grads = model.loss_and_grad(params, x, y)
    assert loss.dtype == np.float64 and all(g.dtype == np.float64 for g in grads.values())
    for worker in range(2):
        for name in params:
            rel = central_difference_error(model, params, x, y, grads, worker, name, 12, rng)
            assert rel < 1e-5, f"{key} worker {worker} {name}: relative error {rel:.2e}"


@pytest.mark.parametrize("key", ["mlp", "convnet1d", "softmax"])
def test_float32_gradient_close_to_float64(key):
    model = REALISTIC[key]
    params = model.init(0)
    x, y = make_data(model, 2, 16)
    l32, g32 = model.loss_and_grad(params, x, y)
    l64, g64 = model.loss_and_grad(as64(params), x.astype(np.float64), y)
    np.testing.assert_allclose(l32, l64, rtol=1e-5)
    for k in g32:
        err = np.linalg.norm(g32[k] - g64[k]) / max(np.linalg.norm(g64[k]), 1e-12)
        assert err < 1e-4, (k, err)


# ---------------------------------------------------------------------------------------------
# bitwise: batched over workers == one worker at a time, and independent of the BLAS thread count


def _assert_batched_equals_single(model, params, x, y):
    loss, grads = model.loss_and_grad(params, x, y)
    for i in range(x.shape[0]):
        li, gi = model.loss_and_grad(params, x[i:i + 1], y[i:i + 1])
        assert np.array_equal(li[0], loss[i]), (model.name, x.shape, i, "loss")
        for k in grads:
            assert np.array_equal(gi[k][0], grads[k][i]), (model.name, x.shape, i, k)
    return loss, grads


BITWISE_CASES = [(k, n, b) for k in REALISTIC for (n, b) in [(1, 8), (3, 7), (8, 64)]]
# long reductions (input dim 500, batch 300): gemms whose K is long enough for a multi-threaded
# OpenBLAS to split it; mlp_wide's 520x520 weight is above TRANSPOSE_MAX, so its input gradient
# keeps the NT gemm form
LONG = {"mlp_long": MLP(dim=500, hidden=(32,), classes=10), "ls_long": LeastSquares(dim=500, l2=0.1),
        "mlp_wide": MLP(dim=40, hidden=(520, 520), classes=10, l2=0.01)}


@pytest.mark.parametrize("key,n,b", BITWISE_CASES + [(k, n, 300) for k in LONG for n in (1, 3)])
def test_batched_equals_single_worker_bitwise(key, n, b):
    model = REALISTIC.get(key) or LONG[key]
    params = model.init(5)
    x, y = make_data(model, n, b, seed=n * 100 + b)
    loss, grads = _assert_batched_equals_single(model, params, x, y)
    assert loss.shape == (n,) and loss.dtype == np.float64
    for k, s in model.layer_shapes().items():
        assert grads[k].shape == (n, *s) and grads[k].dtype == np.float32


@pytest.mark.skipif(threadpool_limits is None, reason="threadpoolctl not installed")
@pytest.mark.parametrize("key", list(REALISTIC) + list(LONG))
def test_bits_independent_of_blas_threads(key):
    """The process's BLAS limit (1, 2 or 4 threads, set on every BLAS library) does not change a bit.
    Without tgsim.blas's pin this fails on OpenBLAS's Haswell kernel (OPENBLAS_CORETYPE=Haswell)."""
    model = REALISTIC.get(key) or LONG[key]
    params = model.init(7)
    b = 300 if key in LONG else 64
    x, y = make_data(model, 3, b, seed=9)
    results = {}
    for threads in (1, 2, 4):
        with threadpool_limits(limits=threads, user_api="blas"):
            results[threads] = _assert_batched_equals_single(model, params, x, y)
    l1, g1 = results[1]
    for threads in (2, 4):
        lt, gt = results[threads]
        assert np.array_equal(l1, lt), f"{key}: the loss changes with {threads} BLAS threads"
        for k in g1:
            assert np.array_equal(g1[k], gt[k]), f"{key}: {k} changes with {threads} BLAS threads"


@pytest.mark.skipif(threadpool_limits is None, reason="threadpoolctl not installed")
def test_gemms_run_single_threaded_and_the_limit_is_restored(monkeypatch):
    """The models' BLAS library is found (so the pin is not silently a no-op on this install), runs
    every product at one thread, and is back at the process's limit afterwards."""
    from tgsim import blas
    from tgsim.models import _numba_bmm

    ctl = blas.gemm_controller()
    assert ctl is not None, f"the models' BLAS library is not controllable: {blas.describe()}"
    seen = []
    real = _numba_bmm._products_serial

    def spy(*args):
        seen.append(ctl.get_num_threads())
        return real(*args)

    monkeypatch.setattr(_numba_bmm, "_products_serial", spy)
    with threadpool_limits(limits=2, user_api="blas"):
        matmul_workers(np.ones((1, 4, 5), np.float32), np.ones((5, 3), np.float32))
        assert ctl.get_num_threads() == 2
    assert seen == [1]


# operand layouts of the models' products: C rows, a swapaxes view (the weight gradient h^T d), a
# transposed weight (w.T above TRANSPOSE_MAX), a strided slice, a shared b
def _layouts(rng, n, m, k, p, dtype):
    h = rng.standard_normal((n, k, m)).astype(dtype)
    yield "C @ shared", rng.standard_normal((n, m, k)).astype(dtype), rng.standard_normal((k, p)).astype(dtype)
    yield "swapaxes @ per-worker", np.swapaxes(h, 1, 2), rng.standard_normal((n, k, p)).astype(dtype)
    yield "C @ shared.T", rng.standard_normal((n, m, k)).astype(dtype), rng.standard_normal((p, k)).astype(dtype).T
    wide = rng.standard_normal((n, m, k + 9)).astype(dtype)
    yield "column slice @ per-worker slice", wide[..., 3:3 + k], rng.standard_normal((n, k + 5, p)).astype(dtype)[:, 2:2 + k]
    yield "swapaxes of a slice @ (1, K, P)", np.swapaxes(rng.standard_normal((n, k + 4, m)).astype(dtype)[:, 1:1 + k], 1, 2), \
        rng.standard_normal((1, k, p)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,m,k,p", [(1, 8, 40, 256), (5, 8, 256, 256), (7, 256, 8, 256), (3, 40, 44, 520),
                                     (3, 1, 33, 1), (4, 6, 1, 9)])
def test_matmul_workers_worker_bits_do_not_depend_on_n_driver_or_threads(monkeypatch, dtype, n, m, k, p):
    """Worker w's product is the same gemm call whatever the batch: equal, bit for bit, to the call
    on x[w:w+1] alone, to the serial driver, and at 1 Numba thread; and close to np.matmul.
    (3, 40, 44, 520) is a shape where OpenBLAS's TN and NN kernels round differently, so a layout
    choice that depended on N (a one-worker slice is "C-contiguous" where the batch is not) fails.)"""
    import numba

    from tgsim.models import _numba_bmm

    rng = np.random.default_rng([n, m, k, p])
    for name, a, b in _layouts(rng, n, m, k, p, dtype):
        got = matmul_workers(a, b)
        ut = np.uint32 if dtype == np.float32 else np.uint64
        for w in range(n):
            one = matmul_workers(a[w:w + 1], b if b.ndim == 2 or b.shape[0] == 1 else b[w:w + 1])
            assert np.array_equal(one[0].view(ut), got[w].view(ut)), (name, w)
        for serial_work in (0, 1 << 62):
            monkeypatch.setattr(_numba_bmm, "SERIAL_WORK", serial_work)
            assert np.array_equal(matmul_workers(a, b).view(ut), got.view(ut)), (name, serial_work)
        monkeypatch.undo()
        before = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            assert np.array_equal(matmul_workers(a, b).view(ut), got.view(ut)), (name, "1 thread")
        finally:
            numba.set_num_threads(before)
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, np.matmul(a, b), rtol=tol, atol=tol * np.sqrt(k))


def test_matmul_workers_edges_and_errors():
    a = np.ones((2, 3, 0), np.float32)
    assert np.array_equal(matmul_workers(a, np.ones((0, 4), np.float32)), np.zeros((2, 3, 4), np.float32))
    assert matmul_workers(np.ones((0, 3, 2)), np.ones((2, 4))).shape == (0, 3, 4)
    out = np.full((2, 3, 4), np.nan, np.float32)
    assert matmul_workers(np.ones((2, 3, 5), np.float32), np.ones((5, 4), np.float32), out=out) is out
    assert np.all(out == 5)
    with pytest.raises(ValueError, match="one float dtype"):
        matmul_workers(np.ones((2, 3, 5), np.float32), np.ones((5, 4), np.float64))
    with pytest.raises(ValueError, match="one float dtype"):
        matmul_workers(np.ones((2, 3, 5), np.float32), np.ones((3, 5, 4), np.float32))   # 3 workers' b for 2
    with pytest.raises(ValueError, match="one float dtype"):
        matmul_workers(np.ones((2, 3, 5), np.int32), np.ones((5, 4), np.int32))
    with pytest.raises(ValueError, match="C-contiguous"):
        matmul_workers(np.ones((2, 3, 5)), np.ones((5, 4)), out=np.empty((2, 4, 3)).transpose(0, 2, 1))
    # bmm keeps other operands on xp.matmul: integer products, a broadcast left operand
    ai, bi = np.arange(6).reshape(1, 2, 3), np.arange(12).reshape(2, 3, 2)
    assert np.array_equal(mbase.bmm(np, ai, bi), np.matmul(ai, bi))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_keep_where_is_where_bit_for_bit(dtype):
    rng = np.random.default_rng(2)
    d = rng.standard_normal((3, 5, 7)).astype(dtype)
    pre = rng.standard_normal((3, 5, 7)).astype(dtype)
    d.reshape(-1)[:6] = [np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0]
    pre.reshape(-1)[6:9] = [np.nan, 0.0, -0.0]
    ut = {2: np.uint16, 4: np.uint32, 8: np.uint64}[d.dtype.itemsize]
    got = mbase.keep_where(np, pre > 0, d)
    want = np.where(pre > 0, d, dtype(0))
    assert got.dtype == d.dtype and np.array_equal(got.view(ut), want.view(ut))
    # a broadcast operand (the max-pool backward's d[..., None, :])
    keep = rng.random((3, 5, 2, 7)) < 0.5
    got = mbase.keep_where(np, keep, d[:, :, None, :])
    want = np.where(keep, d[:, :, None, :], dtype(0))
    assert got.shape == want.shape and np.array_equal(got.view(ut), want.view(ut))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numba_relu_and_backward_are_the_numpy_forms_bit_for_bit(dtype):
    """relu == np.maximum(z, 0) and relu_backward == np.where(pre > 0, d, 0), bit for bit, on
    special values (signed NaN and zero, infinities, subnormals); non-plain inputs (a strided view,
    mixed dtypes, a broadcast) take the NumPy forms and give the same bits."""
    from tgsim.models import _numba_elementwise as ne

    rng = np.random.default_rng(3)
    tiny = np.finfo(dtype).smallest_subnormal
    special = np.array([np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, tiny, -tiny, 1.0, -1.0], dtype=dtype)
    z = rng.standard_normal((4, 6, 10)).astype(dtype)
    z.reshape(-1)[:10] = special
    d = rng.standard_normal(z.shape).astype(dtype)
    d.reshape(-1)[10:20] = special
    ut = np.uint32 if dtype == np.float32 else np.uint64
    want_relu = np.maximum(z, dtype(0))
    assert np.array_equal(ne.relu(z).view(ut), want_relu.view(ut))
    assert np.array_equal(mbase.relu(np, z).view(ut), want_relu.view(ut))
    want_keep = np.where(z > 0, d, dtype(0))
    assert np.array_equal(ne.keep_positive(z, d).view(ut), want_keep.view(ut))
    assert np.array_equal(mbase.relu_backward(np, z, d).view(ut), want_keep.view(ut))
    strided = z[:, ::2]
    assert ne.relu(strided) is None and ne.keep_positive(z, d.astype(np.float16)) is None
    assert ne.keep_positive(z[:, :1], d) is None
    assert np.array_equal(mbase.relu(np, strided).view(ut), np.maximum(strided, dtype(0)).view(ut))
    assert np.array_equal(mbase.relu_backward(np, z[:, :1], d).view(ut),
                          np.where(z[:, :1] > 0, d, dtype(0)).view(ut))


def test_bmm_matches_matmul_closely():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 5, 3 * 256 + 17)).astype(np.float64)
    b = rng.standard_normal((a.shape[-1], 4))
    np.testing.assert_allclose(mbase.bmm(np, a, b), np.matmul(a, b), rtol=1e-12, atol=1e-12)
    # the transposed (weight-gradient) form: a swapaxes view with a long reduction, per-worker b
    h = rng.standard_normal((2, 2 * 256 + 5, 7)).astype(np.float32)
    d = rng.standard_normal((2, h.shape[1], 3)).astype(np.float32)
    got = mbase.bmm(np, np.swapaxes(h, 1, 2), d)
    want = np.einsum("nbi,nbo->nio", h.astype(np.float64), d.astype(np.float64))
    assert got.shape == (2, 7, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# least squares optimum


@pytest.mark.parametrize("l2,bias", [(0.0, True), (0.5, True), (0.1, False)])
def test_least_squares_optimum(l2, bias):
    rng = np.random.default_rng(4)
    m, d = 400, 12
    x = rng.standard_normal((m, d)) * rng.uniform(0.5, 2.0, d) + 1.5
    y = x @ rng.standard_normal(d) + 0.7 + 0.3 * rng.standard_normal(m)
    model = LeastSquares(dim=d, l2=l2, bias=bias)
    opt = model.optimum(x, y)
    assert all(v.dtype == np.float64 for v in opt.values())
    # zero full-batch gradient: one worker holding all samples, in float64
    g_ref = model.loss_and_grad(as64(model.init(0)), x[None], y[None])[1]
    _, g = model.loss_and_grad(opt, x[None], y[None])
    ref = np.sqrt(sum(np.sum(v ** 2) for v in g_ref.values()))
    gnorm = np.sqrt(sum(np.sum(v ** 2) for v in g.values()))
    assert gnorm <= 1e-6 * ref, gnorm / ref
    # it is the minimum: every perturbation increases the objective
    f_star, acc = model.evaluate(opt, x, y)
    assert np.isnan(acc)
    for _ in range(20):
        pert = {k: v + 1e-3 * rng.standard_normal(v.shape) for k, v in opt.items()}
        assert model.evaluate(pert, x, y)[0] > f_star
    if l2 == 0.0 and bias:
        theta, *_ = np.linalg.lstsq(np.c_[x, np.ones(m)], y, rcond=None)
        np.testing.assert_allclose(opt["linear.w"], theta[:d], rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(opt["linear.b"], theta[d:], rtol=1e-8, atol=1e-10)


def test_least_squares_optimum_accepts_worker_layout_and_rejects_singular():
    model = LeastSquares(dim=3, l2=0.0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 10, 3))
    y = rng.standard_normal((4, 10))
    a, b = model.optimum(x, y), model.optimum(x.reshape(40, 3), y.reshape(40))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    xs = np.zeros((10, 3))
    with pytest.raises(ValueError, match="singular"):
        model.optimum(xs, np.zeros(10))
    assert np.isfinite(LeastSquares(dim=3, l2=0.1).optimum(xs, np.zeros(10))["linear.w"]).all()


# ---------------------------------------------------------------------------------------------
# shapes, init, evaluate, registry


@pytest.mark.parametrize("key", list(REALISTIC))
def test_init_deterministic_float32_and_scaled(key):
    model = REALISTIC[key]
    p1, p2, p3 = model.init(11), model.init(11), model.init(12)
    assert list(p1) == list(model.layer_shapes())
    for k, s in model.layer_shapes().items():
        assert p1[k].shape == s and p1[k].dtype == np.float32
        np.testing.assert_array_equal(p1[k], p2[k])
        if k.endswith(".w"):
            assert not np.array_equal(p1[k], p3[k])
            fan_in = s[1] * s[2] if len(s) == 3 else s[0]
            std = float(p1[k].std())
            assert 0.5 / np.sqrt(fan_in) < std < 2.0 * np.sqrt(2.0 / fan_in), (k, std)
        else:
            assert not p1[k].any()
    assert model.num_params == sum(int(np.prod(s)) for s in model.layer_shapes().values())


def test_parameter_counts():
    assert ConvNet1D().num_params == 23_882
    assert MLP(dim=40, hidden=(256, 256)).num_params == 78_858
    assert 10_000 <= ConvNet1D().num_params <= 30_000


@pytest.mark.parametrize("key", list(REALISTIC))
def test_evaluate(key):
    model = REALISTIC[key]
    params = model.init(1)
    x, y = make_data(model, 1, 250, seed=3)
    loss_a, acc_a = model.evaluate(params, x[0], y[0])
    loss_b, acc_b = model.evaluate(params, x[0], y[0], batch_size=32)
    full = model.loss_and_grad(params, x, y)[0][0]
    np.testing.assert_allclose([loss_a, loss_b], full, rtol=1e-6)
    if model.task == "regression":
        assert np.isnan(acc_a) and np.isnan(acc_b)
    else:
        assert 0.0 <= acc_a <= 1.0 and acc_a == acc_b


def test_evaluate_accuracy_of_a_known_classifier():
    model = LogisticRegression(dim=2)
    params = {"linear.w": np.array([1.0, 0.0], np.float32), "linear.b": np.zeros(1, np.float32)}
    x = np.array([[1.0, 5.0], [-1.0, 2.0], [2.0, 0.0], [-3.0, 1.0]], np.float32)
    assert model.evaluate(params, x, np.array([1, 0, 1, 0]))[1] == 1.0
    assert model.evaluate(params, x, np.array([0, 0, 1, 1]))[1] == 0.5


def test_input_validation():
    model = MLP(dim=4, hidden=(3,), classes=3)
    params = model.init(0)
    x, y = make_data(model, 2, 3)
    with pytest.raises(ValueError, match="x must have shape"):
        model.loss_and_grad(params, x[0], y)
    with pytest.raises(ValueError, match="y must have shape"):
        model.loss_and_grad(params, x, y[:, :2])
    with pytest.raises(ValueError, match="labels"):
        model.loss_and_grad(params, x, y + 3)
    with pytest.raises(ValueError, match="integers"):
        model.loss_and_grad(params, x, y.astype(np.float32))
    with pytest.raises(ValueError, match="missing"):
        model.loss_and_grad({k: v for k, v in params.items() if k != "fc1.b"}, x, y)
    with pytest.raises(ValueError, match="channels"):
        ConvNet1D(channels=(8, 0))
    with pytest.raises(ValueError, match="too short"):
        ConvNet1D(length=4, padding="valid")


def test_registry():
    assert set(MODELS) == {"least_squares", "logistic", "softmax", "mlp", "convnet1d"}
    m = make_model("mlp", dim=40, hidden=[64, 32], classes=10)
    assert isinstance(m, MLP) and m.hidden == (64, 32)
    assert make_model("convnet1d") == ConvNet1D()
    assert make_model("least_squares", dim=3, l2=0.5).l2 == 0.5
    assert isinstance(make_model("logistic", dim=3), LogisticRegression)
    assert isinstance(make_model("softmax", dim=3, classes=4), SoftmaxRegression)
    with pytest.raises(ValueError, match="valid names: least_squares, logistic, softmax, mlp, convnet1d"):
        make_model("resnet")
    with pytest.raises(ValueError, match=r"unknown argument\(s\) depth, widht.*valid arguments: dim, hidden"):
        make_model("mlp", dim=3, widht=4, depth=2)
    with pytest.raises(ValueError, match="missing required argument"):
        make_model("softmax")
    for name in MODELS:  # every model satisfies the protocol and is hashable/frozen
        model = make_model(name, **({} if name == "convnet1d" else {"dim": 4}))
        assert isinstance(model, mbase.Model) and model.name == name
        assert model.task in mbase.TASKS
        hash(model)


# ---------------------------------------------------------------------------------------------
# training sanity


def test_mlp_sgd_reduces_loss_on_separable_problem():
    rng = np.random.default_rng(0)
    dim, classes, m = 10, 3, 600
    centers = 3.0 * rng.standard_normal((classes, dim))
    labels = rng.integers(0, classes, m)
    data = (centers[labels] + rng.standard_normal((m, dim))).astype(np.float32)
    model = MLP(dim=dim, hidden=(32,), classes=classes)
    params = model.init(0)
    loss0, _ = model.evaluate(params, data, labels)
    lr, workers, batch = 0.05, 4, 16
    for _ in range(200):
        idx = rng.integers(0, m, (workers, batch))
        _, grads = model.loss_and_grad(params, data[idx], labels[idx])
        params = {k: v - np.float32(lr) * grads[k].mean(axis=0) for k, v in params.items()}
        assert all(v.dtype == np.float32 for v in params.values())
    loss1, acc1 = model.evaluate(params, data, labels)
    assert loss1 < 0.5 * loss0, (loss0, loss1)
    assert acc1 > 0.9


# ---------------------------------------------------------------------------------------------
# GPU: the same lines under CuPy


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU / CuPy")
@pytest.mark.parametrize("key", list(REALISTIC))
def test_cupy_matches_numpy(key):  # pragma: no cover - needs a GPU
    import cupy as cp

    model = REALISTIC[key]
    params = model.init(2)
    x, y = make_data(model, 3, 16)
    loss, grads = model.loss_and_grad(params, x, y)
    lg, gg = model.loss_and_grad({k: cp.asarray(v) for k, v in params.items()}, cp.asarray(x), cp.asarray(y))
    np.testing.assert_allclose(cp.asnumpy(lg), loss, rtol=1e-5)
    for k in grads:
        np.testing.assert_allclose(cp.asnumpy(gg[k]), grads[k], rtol=1e-4, atol=1e-6)
    _assert_batched_equals_single_cupy(model, params, x, y)


def _assert_batched_equals_single_cupy(model, params, x, y):  # pragma: no cover - needs a GPU
    import cupy as cp

    p = {k: cp.asarray(v) for k, v in params.items()}
    loss, grads = model.loss_and_grad(p, cp.asarray(x), cp.asarray(y))
    for i in range(x.shape[0]):
        li, gi = model.loss_and_grad(p, cp.asarray(x[i:i + 1]), cp.asarray(y[i:i + 1]))
        assert bool((li[0] == loss[i]).all())
        for k in grads:
            assert bool(cp.array_equal(gi[k][0], grads[k][i])), (k, i)
