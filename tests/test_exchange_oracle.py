"""The in-process exchange against oracles written here from the definitions, not from tgsim's code.

Bit-equality tests (simulator = MPI, golden hashes) compare two runs that share any bug; these
tests recompute what every mode must deliver from the unpacked codes:

    shared scaler  s_l = max_w s_{w,l}                        (MAX sharing, TernGrad Sec. 3.2)
    mean           (1/N) Σ_w s_{w,l} codes_{w,l}               (every mode, float64 oracle)
"""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.codecs import TernGrad, packing
from tgsim.exchange.inprocess import InProcessExchange
from tgsim.rng import StreamKey

N = 5


def _layers(seed=0):
    rng = np.random.default_rng(seed)
    return [{"w": rng.standard_normal((13, 7)).astype(np.float32) * (1 + w),
             "b": rng.standard_normal(31).astype(np.float32)} for w in range(N)]


def test_shared_scaler_is_the_max_of_the_local_scalers():
    """max_scalers: elementwise maximum over workers, checked against Python's max per layer (a MIN,
    a mean or worker 0's value would each fail here, before any runtime check in the codec)."""
    rng = np.random.default_rng(1)
    local = rng.uniform(0.1, 5.0, (N, 4)).astype(np.float32)
    got = InProcessExchange(N).max_scalers(local)
    assert got.tolist() == [max(local[w, j] for w in range(N)) for j in range(4)]


@pytest.mark.parametrize("mode", ["allreduce", "ps", "allgather", "sharded_ps"])
@pytest.mark.parametrize("shared", [True, False])
def test_every_mode_delivers_the_mean_of_the_decoded_codes(mode, shared):
    """aggregate(...) equals (1/N) Σ_w s_w · codes_w, the codes unpacked from each message's bytes
    and the scalers read from them, in float64, to float32 rounding (rtol 1e-6). A mean divided by
    N + 1, a missing worker or a wrong scaler fails here."""
    if mode in ("allreduce", "sharded_ps") and not shared:
        pytest.skip("integer code sums need shared scalers (a config error otherwise)")
    codec = TernGrad(clip="none", kernels="reference")
    ex = InProcessExchange(N)
    layers = _layers()
    scalings = [codec.scaling(g) for g in layers]
    local = np.stack([codec.local_scalers(s) for s in scalings])
    sh = ex.max_scalers(local) if shared else None
    if shared:
        assert np.all(sh >= local)
    msgs = [codec.encode(g, StreamKey(7, 3, w), shared_scalers=sh, stats=scalings[w])
            for w, g in enumerate(layers)]
    mean, _ = ex.aggregate(codec, msgs, mode, shared)
    for i, name in enumerate(["w", "b"]):
        n = layers[0][name].size
        want = np.zeros(n)
        for m in msgs:
            buf = np.frombuffer(m.to_bytes(), dtype=np.uint8)      # the message's own bytes
            parsed = codec.from_bytes(buf, m)
            codes = packing.unpack(np.asarray(parsed.parts[i]), n, codec.packing).astype(np.float64)
            want += float(parsed.scalers[i]) * codes
        want /= N
        np.testing.assert_allclose(np.asarray(mean[name], np.float64).reshape(-1), want, rtol=1e-6, atol=0)
