"""tgsim/codecs/terngrad/moments.py: the lane count shared with the CUDA kernels and empty edge
cases."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.mutation
def test_lane_count_is_the_cuda_kernels_and_empty_edges():
    """moments: LANES is the CUDA header's TG_LANES (the CPU and GPU sums share the lane order);
    an empty layer's lane sums are (0, 0, 0) and σ of no elements is 0; layer_moments computes σ by
    default."""
    import re
    from pathlib import Path

    from tgsim.codecs.terngrad import moments

    header = (Path(moments.__file__).resolve().parents[2] / "cuda" / "philox.cuh").read_text()
    assert int(re.search(r"#define TG_LANES (\d+)", header).group(1)) == moments.LANES == 65536
    assert moments.lane_sums(np.zeros(0, np.float32)) == (0.0, 0.0, 0.0)
    assert moments.moments_from_sums(0, 0.0, 0.0, 0.0) == 0.0
    g = np.arange(10, dtype=np.float32)
    assert moments.layer_moments(g).sigma == pytest.approx(np.std(np.arange(10.0)), rel=1e-15)
