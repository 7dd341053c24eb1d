"""tgsim/exchange/base.py: CommBytes, the ring all-reduce and own-wire byte counts, the mean of
scalers. Expected values are worked out by hand or with plain NumPy, never with the module under
test."""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.exchange.base import CommBytes, mean_of_scalers, own_wire_bytes, ring_allreduce_bytes
from tgsim.exchange.inprocess import InProcessExchange


@pytest.mark.mutation
def test_comm_bytes_start_at_zero_and_add():
    """CommBytes() is (0, 0); += adds sent to sent and received to received."""
    b = CommBytes()
    assert (b.sent, b.received) == (0.0, 0.0)
    b += CommBytes(3, 5)
    b += CommBytes(10, 20)
    assert (b.sent, b.received) == (13, 25)


@pytest.mark.mutation
@pytest.mark.parametrize("workers, want", [(1, 0.0), (2, 100.0), (4, 150.0), (8, 175.0)])
def test_ring_allreduce_bytes_by_hand(workers, want):
    """2 (N-1)/N x 100 bytes: N = 2 -> 100, 4 -> 150, 8 -> 175; one worker sends nothing."""
    assert ring_allreduce_bytes(100, workers) == want


@pytest.mark.mutation
def test_own_wire_bytes_by_hand():
    """allgather: N-1 messages out and in (4 workers, 30-byte messages: 90, 90); ps: one message up,
    the float32 mean down (layers of 6 and 2 elements: 32 bytes); allreduce: refused."""
    mean = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(2, np.float32)}
    ag = own_wire_bytes(30, mean, "allgather", 4)
    assert (ag.sent, ag.received) == (90, 90)
    ps = own_wire_bytes(30, mean, "ps", 4)
    assert (ps.sent, ps.received) == (30, 32)
    with pytest.raises(ValueError, match="allreduce"):
        own_wire_bytes(30, mean, "allreduce", 4)
    vote = own_wire_bytes(30, mean, "ps", 4, "majority")      # signSGD's vote: 8 elements in 2 bytes
    assert (vote.sent, vote.received) == (30, 2)


@pytest.mark.mutation
def test_mean_of_scalers_by_hand():
    """(1 + 2 + 6) / 3 = 3 and (0.5 + 0.5 + 2) / 3 = 1, in float32; one row divided by 2 is halved."""
    rows = np.array([[1, 0.5], [2, 0.5], [6, 2]], dtype=np.float32)
    out = mean_of_scalers(rows, 3)
    assert out.dtype == np.float32 and out.tolist() == [3.0, 1.0]
    assert mean_of_scalers(np.array([[4.0]], np.float32), 2).tolist() == [2.0]
    assert InProcessExchange(3).mean_scalers(rows).tolist() == [3.0, 1.0]
