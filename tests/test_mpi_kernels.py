"""The exact fp32 exchange's fused ordered mean == the NumPy order, bit for bit (no MPI needed)."""

import numpy as np
import pytest

from tgsim.exchange._numba_mean import ordered_mean
from tgsim.exchange.inprocess import mean_of_layers
from tgsim.codecs.ordered_mean import ordered_mean_flat


@pytest.mark.parametrize("workers", [1, 2, 3, 8, 33])
@pytest.mark.parametrize("m", [0, 1, 16383, 16385, 100_003])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ordered_mean_equals_the_numpy_order(workers, m, dtype):
    rng = np.random.default_rng(workers * 31 + m)
    rows = (rng.standard_normal((workers, m)) * np.exp(rng.uniform(-30, 30, (workers, m)))).astype(dtype)
    rows[:, :3] = -0.0 if m >= 3 else rows[:, :3]                  # signed zeros: +0.0 accumulator start
    got = ordered_mean(rows, workers)
    ref = ordered_mean_flat(list(rows), workers)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    sim = mean_of_layers([{"g": r} for r in rows], workers)["g"]   # the simulator's fp32 mean
    assert np.array_equal(got.view(np.uint32), sim.view(np.uint32))


def test_ordered_mean_order_matters_positive_control():
    """Summing in another order gives other bits on cancelling values: the test above can fail."""
    rows = np.array([[1e8], [1.0], [-1e8]], dtype=np.float32)
    fwd = ordered_mean(rows, 1)
    rev = ordered_mean(rows[::-1].copy(), 1)
    assert fwd[0] == rev[0] == 1.0                                   # f64 is exact here...
    rows = np.array([[1e17], [1.0], [-1e17]], dtype=np.float64)
    assert ordered_mean(rows, 1)[0] == 0.0 and ordered_mean(rows[[0, 2, 1]].copy(), 1)[0] == 1.0


def test_ordered_mean_rejects_bad_input():
    with pytest.raises(ValueError, match="float32/float64"):
        ordered_mean(np.zeros((2, 3), np.int32), 2)
    with pytest.raises(ValueError, match="float32/float64"):
        ordered_mean(np.zeros(3, np.float32), 2)
