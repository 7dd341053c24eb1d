"""Exchanges: the in-process one (virtual workers) and, with the `mpi` extra, the MPI one."""

from tgsim.exchange.base import CommBytes, Exchange, ring_allreduce_bytes
from tgsim.exchange.inprocess import InProcessExchange, mean_of_layers, packed_code_mean

__all__ = ["CommBytes", "Exchange", "InProcessExchange", "mean_of_layers", "ring_allreduce_bytes", "packed_code_mean"]
