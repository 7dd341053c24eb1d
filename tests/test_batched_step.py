"""The batched simulator step's fast paths against the functions they replace, bit for bit:
the folded σ pass (tgsim.codecs.terngrad.numba_kernels._sigma_small), the fused shared-scaler mean
(scaled_code_sum), payload batches without copies (layer_payloads) and the vectorised mini-batch
indices (batch_indices_many)."""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.codecs import packing
from tgsim.codecs.terngrad import moments as stats, numba_moments
from tgsim.codecs.terngrad import numba_kernels as nk
from tgsim.codecs.message import layer_payloads, stacked_payloads
from tgsim.codecs.terngrad import TernGrad
from tgsim.data import shard
from tgsim.data.batching import batch_indices, batch_indices_many, worker_batch_indices

from fakes import KINDS, grad

FOLD_SIZES = [2047, 2048, 2049, 2560, 4095, 4097, 10240, 10241, 12289, 16383, 16384, 16385, 32767,
              40000, 57345, 65535, 65536]


@pytest.mark.parametrize("n", FOLD_SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_folded_sigma_pass_has_the_lane_sums_bits(n, kind):
    """Both drivers (serial, one task per worker) give stats.lane_sums' (S1, S2) bits and the
    largest |g| bit pattern, for layers that take the folded pass and ones next to its bounds."""
    G = np.stack([grad(kind, n, seed=s) for s in range(9)])
    if kind == "normal":
        G[3] += np.float32(1e4)           # a large common offset (the K shift)
        G[4, 0] = 0.0                     # K = +0.0 with negative zeros elsewhere
        G[4, 1::2] = -0.0
    bits = G.view(np.uint32)
    for kern in (numba_moments._sigma_serial, numba_moments._sigma_workers):
        sums = np.empty((G.shape[0], 2))
        mb = np.empty(G.shape[0], dtype=np.uint32)
        kern(G, bits, sums, mb)
        for w in range(G.shape[0]):
            _, s1, s2 = stats.lane_sums(G[w])
            assert sums[w].view(np.uint64).tolist() == np.array([s1, s2]).view(np.uint64).tolist(), (kern, w)
            assert mb[w] == (bits[w] & np.uint32(0x7FFFFFFF)).max()


@pytest.mark.parametrize("fmt", ["2bit", "base3"])
@pytest.mark.parametrize("workers", [1, 5, 32, 200])
def test_scaled_code_sum_is_sum_codes_then_scale(fmt, workers):
    rng = np.random.default_rng(workers)
    n = 10_001
    payloads = np.stack([packing.pack(rng.integers(-1, 2, n).astype(np.int8), fmt) for _ in range(workers)])
    dtype = np.int8 if workers <= 127 else np.int16
    for s in (0.0, 1.5, 3.4028234663852886e38, 1e-45, float(np.float32(0.1))):
        want = packing.scale_integer_sum(nk.sum_codes(payloads, n, fmt, dtype), s, workers)
        got = nk.scaled_code_sum(payloads, n, fmt, s, workers)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)), s
    bad = payloads.copy()
    bad[-1, 7] = 0xFF if fmt == "2bit" else 250
    with pytest.raises(ValueError, match=f"payload of worker {workers - 1}: invalid"):
        nk.scaled_code_sum(bad, n, fmt, 1.0, workers)


def test_layer_payloads_uses_the_batch_only_for_its_own_rows():
    codec = TernGrad(clip="explicit", kernels="numba")
    rng = np.random.default_rng(0)
    layers = {"a.w": rng.standard_normal((4, 30, 7)).astype(np.float32),
              "a.b": rng.standard_normal((4, 7)).astype(np.float32)}
    msgs = codec.encode_many(layers, 1, 2, np.arange(4))
    for i in range(2):
        assert layer_payloads(msgs, i) is msgs[0].batch.arrays[i]
    assert np.array_equal(layer_payloads(msgs[::-1], 0), stacked_payloads([m.parts[0] for m in msgs[::-1]]))
    assert layer_payloads(msgs[:3], 0).shape == (3, msgs[0].parts[0].size)
    msgs[2].parts[0] = msgs[2].parts[0].copy()
    msgs[2].parts[0][0] ^= 1
    got = layer_payloads(msgs, 0)
    assert got is not msgs[0].batch.arrays[0] and got[2, 0] == msgs[2].parts[0][0]


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
@pytest.mark.parametrize("nw", [1, 3, 32])
def test_batch_indices_many_equals_per_worker_calls(scheme, nw):
    y = np.random.default_rng(1).integers(0, 10, 3000)
    shards = shard(y, nw, scheme=scheme, alpha=0.3, seed=4)
    small = min(len(s) for s in shards)
    order = list(range(nw))[::-1]                         # any worker ids, in any order
    for batch in sorted({1, 3, 8, small}):
        for step in list(range(70)) + [10**6 + 1, 2**40]:
            for wk in (range(nw), order):
                sh = [shards[w] for w in wk]
                want = np.stack([batch_indices(s, batch, 5, step, w) for s, w in zip(sh, wk)])
                got = batch_indices_many(sh, batch, 5, step, wk)
                assert got.dtype == np.int64 and np.array_equal(got, want), (batch, step)
    assert np.array_equal(worker_batch_indices(shards, 2, 0, 9),
                          np.stack([batch_indices(s, 2, 0, 9, w) for w, s in enumerate(shards)]))


def test_batch_indices_many_errors_like_the_first_failing_worker():
    shards = [np.arange(10), np.arange(10, 14), np.arange(14, 30)]
    with pytest.raises(ValueError, match="worker 1's shard"):
        batch_indices_many(shards, 5, 0, 0, [0, 1, 2])
    with pytest.raises(ValueError, match="batch must be"):
        batch_indices_many(shards, 0, 0, 0, [0, 1, 2])
    with pytest.raises(ValueError, match="seed"):
        batch_indices_many(shards, 2, -1, 0, [0, 1, 2])
    with pytest.raises(ValueError, match="worker must"):
        batch_indices_many(shards, 2, 0, 0, [0, -1, 2])
    with pytest.raises(ValueError, match="shard must"):
        batch_indices_many([np.arange(10), np.ones(4)], 2, 0, 0, [0, 1])
    mixed = [np.arange(10, dtype=np.int32), np.arange(10, 20, dtype=np.uint64)]
    assert np.array_equal(batch_indices_many(mixed, 3, 0, 4, [0, 1]),
                          np.stack([batch_indices(s, 3, 0, 4, w) for w, s in enumerate(mixed)]))
    with pytest.raises(ValueError, match="2 shards for 1 workers"):
        batch_indices_many(shards[:2], 2, 0, 0, [0])


def test_bench_sim_reports_every_ratio_and_the_memory_floor():
    """`tgsim bench sim` on a tiny MLP (a smoke test of the code path, not a timing): every row has
    positive rates and both forms of each speedup; the memory floor is N * params * 4 bytes."""
    from tgsim.bench import sim as bench_sim

    rows = bench_sim.throughput(workers=(1, 3), hidden=(16,), batch=4, repeats=2)
    assert [r["workers"] for r in rows] == [1, 3]
    for r in rows:
        for key in ("steps_per_s", "looped_steps_per_s", "pipeline_steps_per_s"):
            assert np.isfinite(r[key]) and r[key] > 0, key
        for key in ("step", "grad", "pipeline"):
            assert r[f"{key}_speedup"] > 0 and r[f"{key}_speedup_median_round"] > 0, key
    mem = bench_sim.peak_memory(workers=2, hidden=(32,), batch=4)
    assert mem["floor_bytes"] == 2 * mem["params"] * 4 and mem["peak_bytes"] > 0
