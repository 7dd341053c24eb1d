"""tgsim/codecs/ordered_mean.py: edge cases of the ordered float32 mean."""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.codecs.ordered_mean import ordered_mean_flat


@pytest.mark.mutation
def test_ordered_mean_of_no_parts_is_empty():
    """ordered_mean: no parts give an empty float32 array (not one element)."""
    out = ordered_mean_flat([], 3)
    assert out.dtype == np.float32 and out.size == 0
