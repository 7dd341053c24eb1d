"""In-process exchange for N virtual workers: every worker is local, the wire is counted, not sent.

`aggregate` picks the strategy from the codec's declared capabilities (tgsim.codecs.base.CodecProperties):
the ordered fp32 mean where `float_mean`, the packed-code sums where `sums_exactly` (the codec's
`SummableCodes`), and otherwise the codec's messages exchanged whole and combined by `codec.aggregate`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tgsim.backend import array_module
from tgsim.codecs import packing
from tgsim.codecs.message import KIND_TERNARY, layer_payloads
from tgsim.codecs.ordered_mean import ordered_mean
from tgsim.exchange import sharded
from tgsim.exchange.base import CommBytes, mean_of_scalers, own_wire_bytes, ring_allreduce_bytes
from tgsim.exchange.ps_downlink import code_dtype, ps_downlink_size


def mean_of_layers(layers: Sequence[dict], divide_by: int) -> dict:
    """f32(Σ_w f64(g_w) · (1/N)), workers in list order: the one fp32 reduction every path uses
    (tgsim.codecs.ordered_mean)."""
    return ordered_mean(layers, divide_by)


# Elements per step of the integer-sum -> mean conversion of one layer: bounds its float64
# temporaries (scale_integer_sum) to a few MiB whatever the layer size.
_CHUNK = 1 << 16


def _scaled_code_sums(codec, messages: Sequence, layout) -> dict:
    """{ternary layer index: f32((f64(Σ_w codes_w) * f64(s)) * f64(1/N))} of every ternary layer in
    one call where the host kernel set offers `scaled_code_sum_layers` (Numba; s: the shared scaler,
    message 0's), else {} (the layers are summed one by one). Host parts that are not one
    encode_many call's rows go by address, not stacked. The caller has checked N (`code_dtype`)."""
    tern = [i for i, spec in enumerate(layout.layers) if spec.kind == KIND_TERNARY]
    n = len(messages)
    if not tern or any(array_module(messages[0].parts[i]) is not np for i in tern):
        return {}
    step = getattr(codec.kernels_for(np), "scaled_code_sum_layers", None)
    if step is None:
        return {}
    rows = getattr(messages[0], "batch", None) is None
    payloads = [[m.parts[i] for m in messages] if rows else layer_payloads(messages, i, np) for i in tern]
    scalers = np.array([messages[0].scalers[i] for i in tern], dtype=np.float64)
    got = step(payloads, [layout.layers[i].size for i in tern], codec.packing, scalers, n)
    return dict(zip(tern, got))


def packed_code_mean(codec, messages: Sequence, mode: str, shared: bool,
                  reternarize_key=None) -> tuple[dict, dict]:
    """The aggregate of all N packed-code messages (a `SummableCodes` codec) in `mode`, and the downlink payload sizes.

    Returns (mean per layer, info) where info holds the real downlink payload sizes in bytes.
    "sharded_ps" (shared scalers only, no re-ternarization) gives the allreduce and ps modes' mean.
    """
    n = len(messages)
    layout = messages[0].layout
    if mode == "sharded_ps" and (not shared or reternarize_key is not None):
        raise ValueError(sharded.refusal(shared, reternarize_key is not None))
    if mode == "allgather" or not shared:
        mean = codec.aggregate(messages, divide_by=n)
        down = 0                  # no downlink in an all-gather; ps sets it below (allreduce needs sharing)
    else:
        dtype = code_dtype(n)     # int8 / int16, as the MPI all-reduce; ValueError above 32767 workers
        mean, down = {}, 0
        whole = _scaled_code_sums(codec, messages, layout)
        for i, spec in enumerate(layout.layers):
            if i in whole:
                down += np.dtype(dtype).itemsize * spec.size
                mean[spec.name] = whole[i].reshape(spec.shape)
                continue
            parts = [m.parts[i] for m in messages]
            if spec.kind != KIND_TERNARY:
                mean[spec.name] = mean_of_layers([{spec.name: p} for p in parts], n)[spec.name].reshape(spec.shape)
                down += 4 * spec.size
                continue
            s = float(messages[0].scalers[i])
            xp = array_module(parts[0])           # CuPy payloads are summed on the device
            kern = codec.kernels_for(xp)
            if hasattr(kern, "scaled_code_sum") and n <= 32767:
                # sum_codes + scale_integer_sum fused in one pass (Numba): the same bits
                out = kern.scaled_code_sum(layer_payloads(messages, i, xp), spec.size, codec.packing, s, n)
            else:
                intsum = kern.sum_codes(layer_payloads(messages, i, xp), spec.size, codec.packing, dtype)
                out = xp.empty(spec.size, dtype=xp.float32)
                for a in range(0, spec.size, _CHUNK):
                    out[a:a + _CHUNK] = packing.scale_integer_sum(intsum[a:a + _CHUNK], s, n)
            down += np.dtype(dtype).itemsize * spec.size    # the int8/int16 sums of the all-reduce
            mean[spec.name] = out.reshape(spec.shape)
    if mode == "ps":
        # the bytes the MPI server sends (ps_downlink: Σ codes + N bit-packed, or the float32 mean);
        # the simulator counts them without materialising the packed bits, whose round trip is the
        # identity (0 <= Σ codes + N <= 2N < 2^width; tests/test_batched_codec.py checks both)
        down = ps_downlink_size(layout, n, shared, False)
    info = {"down_payload": down}
    if reternarize_key is not None:
        plain = codec.downlink_codec()
        msg = plain.encode(mean, reternarize_key)
        mean = plain.decode(msg)
        info["down_payload"] = msg.wire_bytes
    return mean, info


class InProcessExchange:
    """All N workers live in this process (the simulator)."""

    def __init__(self, n_workers: int):
        self.n_workers = n_workers
        self.local_workers = tuple(range(n_workers))

    def check_same_config(self, digest: str, shard_plan: str | None = None) -> None:
        return None  # one process, one config

    def gather_rows(self, local: np.ndarray, root: int = 0) -> np.ndarray:
        """Every worker is local: its rows, as they are."""
        local = np.asarray(local)
        if local.shape[0] != self.n_workers:
            raise ValueError(f"gather_rows: {local.shape[0]} rows for {self.n_workers} workers")
        return local

    def any_true(self, flag: bool) -> bool:
        return bool(flag)

    def mean_scalar(self, local_sum: float) -> float:
        return local_sum / self.n_workers

    def max_scalers(self, local: np.ndarray) -> np.ndarray:
        return np.max(np.asarray(local, dtype=np.float32), axis=0)

    def mean_scalers(self, local: np.ndarray) -> np.ndarray:
        """f32(Σ_w f64(s_w) / N) per layer, workers in order (the MPI exchange gives the same bits)."""
        return mean_of_scalers(np.asarray(local, dtype=np.float32), self.n_workers)

    def mean_fp32(self, local_layers: Sequence[dict]) -> tuple[dict, CommBytes]:
        n = self.n_workers
        nbytes = sum(4 * int(np.size(v)) for v in local_layers[0].values())
        b = ring_allreduce_bytes(nbytes, n)
        return mean_of_layers(local_layers, n), CommBytes(b, b)

    def aggregate(self, codec, local_messages, mode, shared, reternarize_key=None):
        """The mean over all workers of their messages, and the bytes one worker sent and received."""
        props = codec.properties
        if props.float_mean:
            return self.mean_fp32(local_messages)
        if not props.sums_exactly:
            mean = codec.aggregate(local_messages, divide_by=self.n_workers)
            sizes = [m.wire_bytes for m in local_messages]      # equal, except for variable-size codecs
            wire = sizes[0] if len(set(sizes)) == 1 else sum(sizes) / len(sizes)   # then: the mean worker
            return mean, own_wire_bytes(wire, mean, mode, self.n_workers, codec.properties.combine)
        return self._packed_codes(codec, local_messages, mode, shared, reternarize_key)

    def _packed_codes(self, codec, local_messages, mode, shared, reternarize_key=None):
        n = self.n_workers
        mean, info = packed_code_mean(codec, local_messages, mode, shared, reternarize_key)
        wire = local_messages[0].wire_bytes
        n_layers = len(local_messages[0].layout.layers)
        scal = ring_allreduce_bytes(4 * n_layers, n) if shared else 0.0
        if mode == "allgather":
            bytes_ = CommBytes((n - 1) * wire, (n - 1) * wire)
        elif mode == "allreduce":
            b = ring_allreduce_bytes(info["down_payload"], n)
            bytes_ = CommBytes(b, b)
        elif mode == "sharded_ps":    # worker 0's bytes, those of rank 0 over MPI
            bytes_ = sharded.sharded_bytes(local_messages[0].layout, n, 0, codec.packing)
        else:  # ps: push own message, pull the server's downlink
            bytes_ = CommBytes(wire, info["down_payload"])
        bytes_ += CommBytes(scal, scal)
        return mean, bytes_
