"""tgsim/codecs/terngrad/numba_layers.py: each whole-step Numba function against the per-layer Numba
function it stands for (moments_many, encode_many, weighted_sum, scaled_code_sum), bit for bit and
error for error, over layers of different sizes (empty, 1 element, the folded and the lane-partial
σ passes), W = 1 and 3, non-finite rows, clip bounds +inf / finite / NaN, both packings, and the
serial and the parallel drivers."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tgsim.codecs import packing
from tgsim.codecs.terngrad import numba_common, numba_layers as nl
from tgsim.codecs.terngrad.numba_decode import scaled_code_sum, sum_codes, weighted_sum
from tgsim.codecs.terngrad.numba_encode import encode_many
from tgsim.codecs.terngrad.numba_moments import moments_many

SIZES = [0, 1, 3, 17, 2053, 1000, 65541]     # 2053: folded σ pass; 65541 > LANES: lane partials
FORMATS = ["2bit", "base3"]
DRIVERS = {"serial": 1 << 62, "parallel": 0}  # the thresholds numba_common.SERIAL_* are set to


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def drive(monkeypatch, driver: str) -> None:
    for name in ("SERIAL_MOMENTS", "SERIAL_ABSMAX", "SERIAL_FOLD", "SERIAL_ENCODE", "SERIAL_DECODE"):
        monkeypatch.setattr(numba_common, name, DRIVERS[driver])


def layers(nw: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    gs = [(rng.standard_normal((nw, n)) * 10.0 ** rng.uniform(-3, 2)).astype(np.float32) for n in SIZES]
    gs[3][nw - 1, 5] = np.nan      # the last worker of one layer, worker 0 of another
    gs[4][0, 2050] = -np.inf
    return gs


def payloads(nw: int, fmt: str, seed: int = 0) -> list:
    gs = layers(nw, seed)
    sc = np.abs(np.random.default_rng(seed).standard_normal((nw, len(gs)))).astype(np.float32) + 0.5
    return [encode_many(np.nan_to_num(g), sc[:, i], np.full(nw, np.inf), 5, 1, np.arange(nw), i, fmt)
            for i, g in enumerate(gs)]


@pytest.mark.parametrize("nw", [1, 3])
@pytest.mark.parametrize("driver", list(DRIVERS))
def test_moments_layers_equal_moments_many(monkeypatch, nw, driver):
    drive(monkeypatch, driver)
    gs = layers(nw)
    for need_sigma in (False, True):
        got = nl.moments_layers(gs, need_sigma)
        assert len(got) == len(gs)
        for g, mine in zip(gs, got):
            ref = moments_many(g, need_sigma)
            assert all(same(a, b) for a, b in zip(mine, ref)), (g.shape, need_sigma)


@pytest.mark.parametrize("nw", [1, 3])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("driver", list(DRIVERS))
def test_encode_layers_equal_encode_many(monkeypatch, nw, fmt, driver):
    """Clip bounds +inf (no clipping), finite (explicit) and one NaN row; scalers per worker and layer."""
    drive(monkeypatch, driver)
    gs = [np.nan_to_num(g) for g in layers(nw, 1)]
    rng = np.random.default_rng(2)
    scalers = (np.abs(rng.standard_normal((nw, len(gs)))) + 0.1).astype(np.float32)
    bounds = [np.full(nw, np.inf) if i % 2 else rng.uniform(0.05, 2.0, nw) for i in range(len(gs))]
    bounds[2][nw - 1] = np.nan
    ids = [7 * i + 1 for i in range(len(gs))]
    workers = np.arange(nw, dtype=np.uint32) + 4
    got = nl.encode_layers(gs, scalers, bounds, 2**40 + 3, 9, workers, ids, fmt)
    for i, g in enumerate(gs):
        assert same(got[i], encode_many(g, scalers[:, i], bounds[i], 2**40 + 3, 9, workers, ids[i], fmt)), i


@pytest.mark.parametrize("nw", [1, 3, 9])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("driver", list(DRIVERS))
def test_weighted_sum_layers_equal_weighted_sum(monkeypatch, nw, fmt, driver):
    """Per layer one shared scaler (the count route), distinct ones and zeros (the table route; nine
    workers: one past the table, added in float64); payloads as (W, nbytes) arrays and as lists."""
    drive(monkeypatch, driver)
    pay = payloads(nw, fmt)
    rng = np.random.default_rng(nw)
    scalers = rng.uniform(1e-3, 4.0, (nw, len(SIZES))).astype(np.float32)
    scalers[:, 1] = scalers[0, 1]
    scalers[:, 2] = 0.0
    scalers[:, 5] = scalers[0, 5]
    for given in (pay, [list(p) for p in pay]):
        got = nl.weighted_sum_layers(given, scalers, SIZES, fmt, 3)
        for i, n in enumerate(SIZES):
            assert same(got[i], weighted_sum(pay[i], scalers[:, i], n, fmt, 3)), i
    got = nl.scaled_code_sum_layers(pay, SIZES, fmt, scalers[0], nw)
    for i, n in enumerate(SIZES):
        assert same(got[i], scaled_code_sum(pay[i], n, fmt, scalers[0, i], nw)), i


def test_no_workers_and_no_layers():
    sizes = [0, 5]
    empty = [np.zeros((0, packing.packed_size(n, "2bit")), np.uint8) for n in sizes]
    for got, n in zip(nl.weighted_sum_layers(empty, np.zeros((0, 2), np.float32), sizes, "2bit", 1), sizes):
        assert same(got, weighted_sum(np.zeros((0, packing.packed_size(n, "2bit")), np.uint8),
                                      np.zeros(0, np.float32), n, "2bit", 1))
    assert nl.weighted_sum_layers([], np.zeros((2, 0)), [], "2bit", 1) == []
    assert nl.moments_layers([], True) == [] and nl.encode_layers([], np.zeros((1, 0)), [], 0, 0, [0], [], "2bit") == []


def corrupt(p: np.ndarray, fmt: str, n: int, w: int, where: str) -> None:
    """Worker w's payload of a layer of n elements: an invalid byte in the middle, or its first pad
    code made +1."""
    if where == "byte":
        p[w, p.shape[1] // 2] = 0xFF
        return
    k = packing.CODES_PER_BYTE[fmt]
    codes = packing.LUT[fmt][0][p[w, -1]].copy()
    codes[n - (p.shape[1] - 1) * k] = 1
    p[w, -1] = sum(int(c + 1) << (2 * m) if fmt == "2bit" else int(c + 1) * 3 ** m for m, c in enumerate(codes))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("driver", list(DRIVERS))
def test_invalid_payloads_raise_the_first_layers_error(monkeypatch, fmt, driver):
    """An invalid byte of worker 2 in one layer and bad pad codes of worker 1 in an earlier one: the
    whole-step calls raise the error of the earlier layer, as the layer-by-layer calls would."""
    drive(monkeypatch, driver)
    pay = payloads(3, fmt)
    scalers = np.full((3, len(SIZES)), 0.5, np.float32)
    corrupt(pay[6], fmt, SIZES[6], 2, "byte")
    bad = [i for i, n in enumerate(SIZES) if packing.packed_size(n, fmt) * packing.CODES_PER_BYTE[fmt] > n][1]
    for first in (6, bad):
        if first == bad:
            corrupt(pay[bad], fmt, SIZES[bad], 1, "pad")
        with pytest.raises(ValueError) as ref:
            for i, n in enumerate(SIZES):
                weighted_sum(pay[i], scalers[:, i], n, fmt, 3)
        assert ("non-zero pad codes" if first == bad else "invalid") in str(ref.value)
        with pytest.raises(ValueError, match=f"^{re.escape(str(ref.value))}$"):
            nl.weighted_sum_layers(pay, scalers, SIZES, fmt, 3)
        with pytest.raises(ValueError, match=f"^{re.escape(str(ref.value))}$"):
            nl.scaled_code_sum_layers([list(p) for p in pay], SIZES, fmt, scalers[0], 3)


def test_bad_arguments_are_refused():
    g = [np.zeros((2, 8), np.float32)]
    with pytest.raises(ValueError, match="scalers"):
        nl.encode_layers(g, np.zeros((1, 1)), [np.zeros(2)], 0, 0, [0, 1], [0], "2bit")
    with pytest.raises(ValueError, match="clip bound vectors"):
        nl.encode_layers(g, np.zeros((2, 1)), [], 0, 0, [0, 1], [0], "2bit")
    with pytest.raises(ValueError, match="layer must be in"):
        nl.encode_layers(g, np.zeros((2, 1)), [np.zeros(2)], 0, 0, [0, 1], [2**32], "2bit")
    with pytest.raises(ValueError, match="packing"):
        nl.encode_layers(g, np.zeros((2, 1)), [np.zeros(2)], 0, 0, [0, 1], [0], "3bit")
    with pytest.raises(ValueError, match="float32"):
        nl.moments_layers([np.zeros((2, 8))], True)
    p = [np.zeros((2, 2), np.uint8), np.zeros((3, 2), np.uint8)]
    with pytest.raises(ValueError, match="same number of payloads"):
        nl.weighted_sum_layers(p, np.zeros((2, 2)), [8, 8], "2bit", 1)
    with pytest.raises(ValueError, match="bytes per worker"):
        nl.weighted_sum_layers(p[:1], np.zeros((2, 1)), [12], "2bit", 1)
    with pytest.raises(ValueError, match="payload of worker 1"):
        nl.scaled_code_sum_layers([[np.zeros(2, np.uint8), np.zeros(3, np.uint8)]], [8], "2bit", [1.0], 1)


@pytest.mark.parametrize("nw", [1, 3])
@pytest.mark.parametrize("fmt", FORMATS)
def test_integer_code_sums_equal_the_per_layer_calls(nw, fmt):
    """sum_codes_layers against sum_codes (default dtype, a wider one into a given buffer), then
    decode_code_sums_layers against packing.decode_code_sums layer by layer; a sum beyond N, and
    an invalid payload, raise the per-layer errors."""
    from tgsim.errors import PayloadError

    pay = payloads(nw, fmt, seed=3)
    got = nl.sum_codes_layers([list(p) for p in pay], SIZES, fmt)
    buf = np.empty(sum(SIZES), np.int16)
    wide = nl.sum_codes_layers(pay, SIZES, fmt, np.int16, out=buf)
    for i, n in enumerate(SIZES):
        assert same(got[i], sum_codes(pay[i], n, fmt)) and same(wide[i], sum_codes(pay[i], n, fmt, np.int16))
        assert np.shares_memory(wide[i], buf) or n == 0
    scalers = np.random.default_rng(1).uniform(0.1, 2.0, len(SIZES)).astype(np.float32)
    flat = np.concatenate(got)
    dec = nl.decode_code_sums_layers(flat, SIZES, nw, scalers)
    offs = np.concatenate([[0], np.cumsum(SIZES)])
    for i in range(len(SIZES)):
        assert same(dec[i], packing.decode_code_sums(flat[offs[i]:offs[i + 1]], nw, float(scalers[i])))
    flat[offs[6] + 7] = nw + 1
    with pytest.raises(PayloadError, match=f"beyond N = {nw}"):
        nl.decode_code_sums_layers(flat, SIZES, nw, scalers)
    corrupt(pay[5], fmt, SIZES[5], nw - 1, "byte")
    with pytest.raises(ValueError) as ref:
        sum_codes(pay[5], SIZES[5], fmt)
    with pytest.raises(ValueError, match=f"^{re.escape(str(ref.value))}$"):
        nl.sum_codes_layers(pay, SIZES, fmt)
    rows = [list(p) for p in pay]                                # listed rows: each must be nb uint8 bytes
    rows[2][nw - 1] = rows[2][nw - 1].view(np.int8)
    with pytest.raises(ValueError, match=f"^payload of worker {nw - 1}: expected .* uint8 bytes .* got int8"):
        nl.sum_codes_layers(rows, SIZES, fmt)
    nb = pay[2][0].size
    rows[2][nw - 1] = np.zeros(nb + 1, np.uint8)
    with pytest.raises(ValueError, match=f"^payload of worker {nw - 1}: expected {nb} uint8"):
        nl.sum_codes_layers(rows, SIZES, fmt)


@pytest.mark.parametrize("k", [4, 5])
def test_chunk_counts_in_numpy_equal_the_kernels(k):
    """encode_layers counts each row's parallel tasks in NumPy (`_enc_chunk_counts`); the tasks the
    kernels run are `_enc_chunks`: the same count for every n, across the chunk boundaries."""
    edge = 4 * nl._ENC2_CHUNK if k == 4 else 20 * nl._B3_UNITS
    near = (edge * np.arange(1, 5)[:, None] + np.arange(-5, 6)[None, :]).ravel()
    ns = np.unique(np.concatenate([np.arange(1, 100), near]))
    ns = ns[ns >= 1]
    assert nl._enc_chunk_counts(ns, k).tolist() == [nl._enc_chunks(int(n), k) for n in ns]
