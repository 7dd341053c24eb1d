"""tgsim/codecs/sparse.py: top-k and random-k, sizes, keep probabilities, the draw and bits per
element. Expected values are worked out by hand or with plain NumPy, never with the module under
test."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tgsim.codecs.base import CodecProperties

from fakes import _header, _kernel_choice


@pytest.mark.mutation
def test_sparse_sizes_and_keep_probabilities_by_hand():
    """index_bytes: 1 up to 2^8 elements, 2 up to 2^16, else 4; message_bytes([2, 1], [4, 300]) =
    21 + (4 + 2 (1 + 4)) + (4 + 1 (2 + 4)) = 45. keep_probabilities (p_i = min(λ a_i, 1), Σ p_i = k):
    a = [4, 1, 1, 2], k = 2: λ = 2 / 8 (4 λ = 1 saturates exactly) -> [1, .25, .25, .5]; a = [10, 1, 1],
    k = 2: λ_0 = 2/12 gives 10 λ_0 > 1, so λ = 1 / (1 + 1) -> [1, .5, .5]; k >= nnz: 1 on the nonzeros;
    k = 0: all 0; k = nnz: exactly 1 on the nonzeros."""
    from tgsim.codecs import sparse

    assert [sparse.index_bytes(n) for n in (1, 256, 257, 65536, 65537)] == [1, 1, 2, 2, 4]
    assert sparse.message_bytes([2, 1], [4, 300]) == 45
    assert sparse.keep_probabilities(np.array([4.0, 1, 1, 2]), 2).tolist() == [1.0, 0.25, 0.25, 0.5]
    assert sparse.keep_scale(np.array([4.0, 1, 1, 2]), 2) == 0.25
    assert sparse.keep_probabilities(np.array([10.0, 1, 1]), 2).tolist() == [1.0, 0.5, 0.5]
    assert sparse.keep_probabilities(np.array([0.0, 3, 0, 1]), 2).tolist() == [0.0, 1.0, 0.0, 1.0]
    assert sparse.keep_probabilities(np.array([0.0, 3, 0, 1]), 5).tolist() == [0.0, 1.0, 0.0, 1.0]
    # k = nnz: exactly 1.0 on the nonzeros (not min(λ a, 1) with λ = 1/49, where (1/49)·49 < 1 in float64)
    assert sparse.keep_probabilities(np.array([0.0, 49.0, 98.0]), 2).tolist() == [0.0, 1.0, 1.0]
    assert sparse.keep_probabilities(np.array([2.0, 3]), 0).tolist() == [0.0, 0.0]


@pytest.mark.mutation
def test_sparse_options_properties_and_kernel_choice():
    """TopK / RandomK: registered as "topk" / "randomk", biased / unbiased, own wire, mean; defaults
    density 0.01, k 0, kernels "auto"; density 1 and k = 2^32 - 1 are accepted (NumPy numbers too);
    from_config reads density, k and kernels (default "auto"); the Numba kernels for "auto"/"numba"
    on NumPy arrays only."""
    import types

    from tgsim.codecs.sparse import RandomK, TopK

    assert TopK.name == "topk" and RandomK.name == "randomk"
    assert TopK.properties == CodecProperties(unbiased=False, wire="own", combine="mean")
    assert RandomK.properties == CodecProperties(unbiased=True, wire="own", combine="mean")
    c = TopK()
    assert (c.density, c.k, c.kernels) == (0.01, 0, "auto")
    assert TopK(density=1).density == 1.0 and RandomK(k=2**32 - 1).k == 2**32 - 1
    assert TopK(density=np.float32(0.5)).density == 0.5 and TopK(k=np.int64(4)).k == 4
    for k in ("auto", "reference", "numba", "cuda"):
        assert RandomK(kernels=k).kernels == k
    got = RandomK.from_config(types.SimpleNamespace(options=dict(density=0.25, k=3)))
    assert (got.density, got.k, got.kernels) == (0.25, 3, "auto")
    assert TopK.from_config(types.SimpleNamespace(options=dict(density=0.5, k=0), kernels="cuda")).kernels == "cuda"
    assert _kernel_choice(TopK) == ([True, True, False, False], [False, False, False])


@pytest.mark.mutation
@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_topk_bytes_by_hand(kernels, monkeypatch):
    """topk, k = 2: v = [0.5, -3, 1, 2] keeps indices 1, 3 (|v| 3 and 2), values -3, 2; a layer of 300
    elements w (2-byte indices) keeps 299 and 7 (|v| 9, 8). Body per layer: count u32 | indices |
    float32 values; header b"TGK1", version 1, 2 layers. The decode is 0 elsewhere; the mean of the
    message with a zero layer's message is half of it, of it alone (divide_by 4) a quarter; the mean
    runs in the Numba decode-sum (once per layer) for "auto" only."""
    from tgsim.codecs import numba_sparse
    from tgsim.codecs.sparse import TopK

    calls = []
    real = numba_sparse.decode_sum
    monkeypatch.setattr(numba_sparse, "decode_sum", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    codec = TopK(k=2, kernels=kernels)
    v = np.array([[0.5, -3.0, 1.0, 2.0]], np.float32)
    w = np.zeros((1, 300), np.float32)
    w[0, 299], w[0, 7] = -9.0, 8.0
    m = codec.encode_many({"v": v, "w": w}, 1, 0, [0])[0]
    raw = m.to_bytes()
    assert _header(raw)[:3] == (b"TGK1", 1, 2)
    want = (b"\x02\x00\x00\x00" + bytes([1, 3]) + np.array([-3, 2], "<f4").tobytes()
            + b"\x02\x00\x00\x00" + np.array([7, 299], "<u2").tobytes() + np.array([8, -9], "<f4").tobytes())
    assert raw[21:] == want and m.wire_bytes == len(raw) == 21 + 14 + 16
    back = codec.from_bytes(raw, m)
    assert back.indices["w"].tolist() == [7, 299] and back.values["v"].tolist() == [-3.0, 2.0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.values = {}
    assert codec.decode(back)["v"].tolist() == [0.0, -3.0, 0.0, 2.0]
    z = codec.encode_many({"v": np.zeros((1, 4), np.float32), "w": np.zeros((1, 300), np.float32)}, 1, 0, [0])[0]
    assert codec.aggregate([back, z])["v"].tolist() == [0.0, -1.5, 0.0, 1.0]
    assert codec.aggregate([back], divide_by=4)["w"][[7, 299]].tolist() == [2.0, -2.25]
    assert len(calls) == (4 if kernels == "auto" else 0)


@pytest.mark.mutation
def test_sparse_bits_per_element():
    """n = 10, k = 2: 8 (21 + 4 + 2 (1 + 4)) / 10 = 28 ("up" for both; topk's "up_max" too); randomk's
    "up_max" keeps all 10: 8 (21 + 4 + 10 · 5) / 10 = 60; down 32; an empty layer costs 0."""
    from tgsim.codecs.sparse import RandomK, TopK

    assert TopK(k=2).link_bits(10, 3) == {"up": 28.0, "up_max": 28.0, "down": 32}
    assert RandomK(k=2).link_bits(10, 3) == {"up": 28.0, "up_max": 60.0, "down": 32}
    for cls in (TopK, RandomK):
        assert cls(k=2).link_bits(0, 3) == {"up": 0.0, "up_max": 0.0, "down": 32}


def _lambda_oracle(a: np.ndarray, k: int) -> float:
    """λ by the rule of the docstring, on the whole sorted array: with a_(0) >= a_(1) >= ... and
    λ_j = (k - j) / Σ_{i >= j} a_(i), the first j with λ_j a_(j) <= 1."""
    s = np.sort(a.astype(np.float64))[::-1]
    tail = np.cumsum(s[::-1])[::-1]
    for j in range(k):
        lam = (k - j) / tail[j]
        if lam * s[j] <= 1.0 + 1e-12:
            return float(lam)
    raise AssertionError("no j")


@pytest.mark.mutation
def test_sparse_keep_scale_of_large_layers_equals_a_sorted_oracle():
    """keep_scale on layers of 2^17 elements (the candidate shortcut: n >= 2^16 and 4 k <= n) equals
    the rule computed on the fully sorted layer (relative 1e-9), and Σ min(λ a_i, 1) = k: |N(0,1)|
    with k = 1000; a layer whose mass is almost all in 30 values of 1000 (the rest below 1e-9, so the
    elements outside the candidates sum to less than 1e-6 of the total: the direct-sum branch),
    k = 20 (λ ~ 20 / 30435: none saturates) and k = 40 (the 30 large values saturate, p = 1, and the
    other 10 are spread over the small ones); top_k_indices there are the k largest (a stable
    argsort of -a); k = 0 gives no index."""
    from tgsim.codecs import sparse

    n = 1 << 17
    normal = np.abs(np.random.default_rng(1).standard_normal(n))
    spiky = np.random.default_rng(2).random(n) * 1e-9
    spiky[np.random.default_rng(3).choice(n, 30, replace=False)] = 1000.0 + np.arange(30)
    for a, k in ((normal, 1000), (spiky, 20), (spiky, 40)):
        lam = sparse.keep_scale(a, k)
        assert lam == pytest.approx(_lambda_oracle(a, k), rel=1e-9), k
        assert np.minimum(lam * a, 1.0).sum() == pytest.approx(k, rel=1e-9)
        got = sparse.top_k_indices(a, k)
        assert got.tolist() == sorted(np.argsort(-a, kind="stable")[:k].tolist())
    assert sparse.top_k_indices(np.ones(3), 0).tolist() == []


@pytest.mark.mutation
@pytest.mark.parametrize("kernels", ["reference", "auto"])
def test_randomk_draw_by_hand(kernels):
    """randomk, n = 200, k = 20, key (seed 7, step 3, worker 5, layer 0): with λ from the sorted
    rule, x_i = λ |v_i| 2^24 and w_i = tgsim.rng.random_words(n, key) >> 8, element i is kept iff
    w_i < x_i, and sent as f32(v_i / (ceil(min(x_i, 2^24)) / 2^24)); the message's bytes read back."""
    from tgsim.codecs.sparse import RandomK
    from tgsim.rng import StreamKey, random_words

    v = np.random.default_rng(4).standard_normal(200).astype(np.float32)
    a = np.abs(v).astype(np.float64)
    x = a * (_lambda_oracle(a, 20) * 2.0**24)
    w = random_words(200, StreamKey(7, 3, 5, 0), np) >> np.uint32(8)
    idx = np.flatnonzero(w < x)
    want = (v[idx].astype(np.float64) / (np.ceil(np.minimum(x[idx], 2.0**24)) / 2.0**24)).astype(np.float32)
    codec = RandomK(k=20, kernels=kernels)
    m = codec.encode_many({"g": v[None]}, 7, 3, [5])[0]
    assert m.indices["g"].tolist() == idx.tolist() and m.values["g"].tolist() == want.tolist()
    assert 5 <= idx.size <= 40
    back = codec.from_bytes(m.to_bytes(), m)
    assert back.values["g"].tolist() == want.tolist()


@pytest.mark.mutation
def test_sparse_words_from_2_15_elements_come_from_the_numba_philox(monkeypatch):
    """_words24: w_i = word_i >> 8 of tgsim.rng.random_words at any length, drawn by the Numba Philox
    from 2^15 = 32768 elements on (documented), by the reference below that."""
    from fakes import numba_philox_calls
    from tgsim.codecs import sparse
    from tgsim.rng import StreamKey, random_words

    calls = numba_philox_calls(monkeypatch)
    key = StreamKey(4, 1, 2, 3)
    for n, numba in ((32767, False), (32768, True)):
        calls.clear()
        got = sparse._words24(n, key)
        assert got.tolist() == (random_words(n, key, np) >> np.uint32(8)).tolist()
        assert calls == ([n] if numba else []), n


@pytest.mark.mutation
def test_sparse_scalar_layers_and_k_range():
    """A 0-d layer (gradients (W,)): each worker's value is a NumPy scalar, encoded as one element
    (topk k = 1 keeps it); k = 2^32 - 1 is the largest k accepted, 2^32 is a ValueError; _host
    returns a NumPy array as it is and calls `.get()` on a device (CuPy) array."""
    from tgsim.codecs import sparse
    from tgsim.codecs.sparse import RandomK, TopK

    class Device:
        def get(self):
            return np.array([4.0, 5.0])

    a = np.ones(2)
    assert sparse._host(a) is a and sparse._host(Device()).tolist() == [4.0, 5.0]

    for kernels in ("auto", "reference"):
        m0, m1 = TopK(k=1, kernels=kernels).encode_many({"s": np.array([1.5, -2.0], np.float32)}, 0, 0, [0, 1])
        assert m0.values["s"].tolist() == [1.5] and m1.values["s"].tolist() == [-2.0]
        assert m1.indices["s"].tolist() == [0]
    for cls in (TopK, RandomK):
        assert cls(k=2**32 - 1).k == 2**32 - 1
        with pytest.raises(ValueError, match="k must be"):
            cls(k=2**32)


@pytest.mark.mutation
@pytest.mark.parametrize("kernels", ["reference", "auto"])
def test_randomk_keeps_only_words_below_the_threshold(kernels, monkeypatch):
    """Keep iff w_i < x_i (strictly): v of 8 multiples of 2^-24 summing to k = 2 with max 1, so
    λ = 2 / 2 = 1 exactly and x_i = v_i 2^24 are integers; v_0 = w_0 2^-24 puts x_0 = w_0 on the
    boundary: element 0 is not kept, element 1 (x = 2^24) always is, every kept value is
    v_i / (x_i / 2^24) = 1. With k = 1 (and more nonzeros) "auto" draws in the Numba kernel."""
    from tgsim.codecs import numba_sparse
    from tgsim.codecs.sparse import RandomK
    from tgsim.rng import StreamKey, random_words

    calls = []
    real = numba_sparse.random_keep
    monkeypatch.setattr(numba_sparse, "random_keep", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    w = (random_words(8, StreamKey(1, 2, 0, 0), np) >> np.uint32(8)).astype(np.int64)
    assert 0 < w[0] < 2**24 - 6
    a = np.zeros(8)
    a[0], a[1] = w[0] / 2**24, 1.0
    rest = 2**24 - w[0]                                   # (1 - a_0) in units of 2^-24, split in 6
    parts = [rest // 6] * 5 + [rest - 5 * (rest // 6)]
    a[2:] = np.array(parts) / 2**24
    assert a.sum() == 2.0 and a.max() == 1.0
    want = np.flatnonzero(w < a * 2**24)
    assert 0 not in want and 1 in want
    codec = RandomK(k=2, kernels=kernels)
    m = codec.encode_many({"g": a.astype(np.float32)[None]}, 1, 2, [0])[0]
    assert m.indices["g"].tolist() == want.tolist() and m.values["g"].tolist() == [1.0] * want.size
    RandomK(k=1, kernels=kernels).encode_many({"g": a.astype(np.float32)[None]}, 1, 2, [0])
    assert len(calls) == (2 if kernels == "auto" else 0)
