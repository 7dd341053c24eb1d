"""The codec contract, public: every registered codec passes it, and a user's own codec can too.

Like numpy.testing, this module is for tests. Subclass `CodecContract` in a pytest `Test*` class
and give it a `codec` fixture; pytest then runs every check below on that codec:

    from tgsim.testing import CodecContract

    class TestMyCodec(CodecContract):
        @pytest.fixture
        def codec(self):
            return MyCodec()

Checks (statistical ones at family-wise alpha = 1e-3, fixed seeds, each with a positive control):
- properties: a CodecProperties instance, a `name`;
- single worker: `encode(layers, key)` is worker key.worker's message of `encode_many`;
- bits: `bits_per_element` counts every byte of a worker's message (`bits_errors`);
- capabilities: every declared capability (float_mean, sums_exactly, defers_encode,
  server_reencodes, stateful, rounds) is implemented (`capability_errors`);
- round trip: encode_many -> to_bytes -> from_bytes -> decode gives the bits of the in-memory decode;
  the same keys give the same bytes; `wire_bytes` is the length of `to_bytes()`;
- malformed bytes (truncated, extended, first byte flipped) raise PayloadError;
- a NaN/Inf gradient raises NonFiniteGradientError naming the layer, before anything is encoded;
- `aggregate(messages, N)` is, bit for bit, f32(Σ_w f64(decode_w) · (1/N)) in worker order (or,
  for `combine = "majority"`, sign(Σ_w decode_w));
- declared unbiasedness is true: over R = 400 draws of a heavy-tailed vector, a codec that declares
  itself unbiased passes the z-tests of E<Q(g), u> = <g, u> (u = g and sign(g)), one that declares
  itself biased fails them (deterministic codecs: exactly Q(g) == g or not), and a copy of the codec
  biased by 5 % is rejected (the test has the power to see a bias). For ternary codecs the exact
  per-coordinate binomial test (tgsim.analysis.unbiasedness) is the sharper tool.
- unbiased codecs, the pooled test with a stated power (tgsim.analysis.pooled_bias): on a Gaussian
  layer of 20,000 elements, R draws chosen from a 64-draw pilot so that a uniform bias of 0.75 % is
  detected with power 0.99 at alpha = 1e-3 (at most 4,096 draws; a codec too noisy for that is
  skipped, saying its smallest detectable bias), the codec is accepted, a copy biased by 1 % is
  rejected, and so is a copy that zeroes the coordinates with |g| below the 10th percentile of |g|
  (a resolution floor). The slow tier (pytest -m slow) repeats the 1 % control at 0.1 % on 10^6
  elements.
"""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.codecs.base import CodecProperties
from tgsim.codecs.ordered_mean import ordered_mean
from tgsim.errors import NonFiniteGradientError, PayloadError

ALPHA = 1e-3
WORKERS = 3
POOLED_N = 20_000          # elements of the pooled test's Gaussian layer (fast tier)
POOLED_DELTA = 0.01        # the fast tier's positive control: a uniform 1 % bias
POOLED_PILOT = 64          # pilot draws that choose R
POOLED_MAX_DRAWS = 4096


def contract_layers(seed: int = 7, workers: int = WORKERS) -> dict:
    """Layers (W, *shape) with a leading worker axis of W = `workers`, drawn with `seed`: heavy tails, a
    zero layer, odd sizes."""
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_t(3, (workers, 7, 13)).astype(np.float32),
            "b": np.zeros((workers, 5), np.float32),
            "t": (rng.standard_t(2, (workers, 1001)) * 1e-3).astype(np.float32)}


def encode(codec, layers: dict, step: int = 0, seed: int = 2024) -> list:
    """The protocol's encode_many of `codec` for every worker of `layers` at `step` with `seed`, shared
    statistics where the codec has them: the list of the workers' messages."""
    workers = np.arange(next(iter(layers.values())).shape[0])
    stats = codec.prepare_many(layers)
    shared = None
    if codec.properties.shared_stats == "max":
        shared = codec.local_scalers_many(stats, len(workers)).max(axis=0)
    return codec.encode_many(layers, seed, step, workers, shared, stats)


def _same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        np.asarray(a[k]).shape == np.asarray(b[k]).shape
        and np.array_equal(np.asarray(a[k], np.float32).view(np.uint32), np.asarray(b[k], np.float32).view(np.uint32))
        for k in a)


def unbiasedness_rejects(codec, g: np.ndarray, R: int = 400, seed: int = 99, scale: float = 1.0,
                         power_out: list | None = None) -> bool:
    """Does the test of E[Q(g)] = g reject, over R draws of layer g (keys: seed, steps 0..R-1)?

    Deterministic codecs (three draws alike): exactly, Q(g) != g anywhere. Stochastic ones: two
    projections, each a sum over all coordinates and so close to normal whatever one coordinate's
    law: p_r = <Q_r(g), u> for u = g and u = sign(g), E p = <g, u> under unbiasedness; reject if
    |mean(p) - <g, u>| / (sd(p) / sqrt(R)) exceeds the two-sided normal quantile at ALPHA / 2 each
    (Bonferroni over the two). u = g weighs the large coordinates (where clipping bites), u = sign(g)
    every coordinate alike. `scale` multiplies every decoded value (a biased copy of the codec: the
    positive control). `power_out`, a list, receives the largest relative bias of the two that the
    test detects with power 0.99 (stochastic codecs)."""
    from scipy.stats import norm

    layers = {"g": g[None]}
    target = g.reshape(-1).astype(np.float64)
    directions = np.stack([target, np.sign(target)])
    proj = []
    first = None
    for r in range(R):
        v = codec.decode(encode(codec, layers, step=r, seed=seed)[0])["g"].reshape(-1).astype(np.float64) * scale
        if first is None:
            first = v
        proj.append(directions @ v)
        if r == 2 and all(np.array_equal(p, proj[0]) for p in proj) and np.array_equal(v, first):
            return bool(np.any(first != target))        # a deterministic codec: exact comparison
    proj = np.asarray(proj)
    se = proj.std(axis=0, ddof=1) / np.sqrt(R)
    z = np.abs(proj.mean(axis=0) - directions @ target) / np.where(se > 0, se, np.inf)
    if power_out is not None:       # the relative bias each projection detects with power 0.99
        power_out.append(float(np.max((norm.ppf(1 - ALPHA / 4) + norm.ppf(0.99)) * se
                                      / np.abs(directions @ target))))
    return bool(np.any(z > norm.ppf(1 - ALPHA / 4)))


def capability_errors(codec, layers: dict | None = None) -> list[str]:
    """What a codec's declared capabilities (tgsim.codecs.base.CodecProperties) promise and it does
    not implement, one line each ([] when all hold), checked on `layers` (default `contract_layers()`):

    float_mean:       each message is its worker's float32 layers (a mapping the exchange averages
                      with `mean_fp32`), bit for bit the decoded message;
    sums_exactly:     `SummableCodes` (a `packing` string, `kernels_for(numpy)` with `sum_codes` and
                      `weighted_sum`), messages with a layout, `parts` and `scalers`;
    defers_encode:    `encode_many(..., deferred=True)` is accepted and decodes to the same bits;
    server_reencodes: `Reencodes`: `downlink_codec()` is a `SingleMessageCodec` whose `encode(mean,
                      key)` / `decode` give every layer back in its shape;
    stateful:         `init_state` (arrays with the local-worker axis first), and `MultiRound` where
                      rounds > 1, else `Stateful`.
    """
    from tgsim.codecs.base import MultiRound, Reencodes, SingleMessageCodec, Stateful, SummableCodes
    from tgsim.rng import StreamKey

    props = codec.properties
    layers = contract_layers() if layers is None else layers
    shapes = {k: tuple(v.shape[1:]) for k, v in layers.items()}
    errors = []
    if props.stateful:
        if not callable(getattr(codec, "init_state", None)):
            errors.append("stateful: no init_state(shapes, n_local)")
        else:
            state = codec.init_state(shapes, WORKERS)
            bad = [k for k, v in state.items() if np.shape(v)[:1] != (WORKERS,) or np.asarray(v).dtype != np.float32]
            if bad:
                errors.append(f"stateful: init_state arrays {bad} lack the float32 (n_local, ...) layout")
        proto = MultiRound if props.rounds > 1 else Stateful
        if not isinstance(codec, proto):
            errors.append(f"stateful with rounds = {props.rounds}: not a {proto.__name__}")
    if props.rounds > 1:
        return errors                     # its messages come from start_rounds, not encode_many
    msgs = encode(codec, layers)
    if props.float_mean:
        for w, m in enumerate(msgs):
            if not hasattr(m, "items") or not _same_bits(dict(m.items()), codec.decode(m)):
                errors.append(f"float_mean: worker {w}'s message is not its float32 layers")
                break
    if props.sums_exactly:
        if not isinstance(codec, SummableCodes) or not isinstance(getattr(codec, "packing", None), str):
            errors.append("sums_exactly: not a SummableCodes (packing, kernels_for)")
        else:
            kern = codec.kernels_for(np)
            missing = [f for f in ("sum_codes", "weighted_sum") if not callable(getattr(kern, f, None))]
            if missing:
                errors.append(f"sums_exactly: kernels_for(numpy) lacks {missing}")
        if not all(hasattr(msgs[0], a) for a in ("layout", "parts", "scalers")):
            errors.append("sums_exactly: the messages lack layout/parts/scalers (tgsim.codecs.message.Message)")
    if props.defers_encode:
        try:
            stats = codec.prepare_many(layers)
            shared = codec.local_scalers_many(stats, WORKERS).max(axis=0) if props.shared_stats == "max" else None
            deferred = codec.encode_many(layers, 2024, 0, np.arange(WORKERS), shared, stats, deferred=True)
        except TypeError as e:
            errors.append(f"defers_encode: encode_many(..., deferred=True) fails: {e}")
        else:
            if not all(_same_bits(codec.decode(d), codec.decode(m)) for d, m in zip(deferred, msgs)):
                errors.append("defers_encode: deferred messages decode to other bits")
    if props.server_reencodes:
        down = codec.downlink_codec() if isinstance(codec, Reencodes) else None
        if not isinstance(down, SingleMessageCodec):
            errors.append("server_reencodes: no downlink_codec() with encode(layers, key) / decode(message)")
        else:
            mean = ordered_mean([codec.decode(m) for m in msgs], WORKERS)
            back = down.decode(down.encode(mean, StreamKey(2024, 0, WORKERS, 0)))
            if {k: np.shape(v) for k, v in back.items()} != shapes:
                errors.append("server_reencodes: the downlink codec does not give the layers back")
    return errors


def bits_errors(codec, layers: dict | None = None) -> list[str]:
    """Where `codec.bits_per_element` is not the measured wire, one line each ([] when it is), on
    `layers` (default `contract_layers()`): for every worker's message, 8 len(to_bytes()) / Σ_l n_l
    equals `bits_per_element` of the layers' shapes (a codec with `bits_exact = False`, whose sizes
    depend on the values: is at most it), and the shapes and one worker's arrays give the same count.
    A codec of R > 1 rounds counts all its rounds: not checked here."""
    if codec.properties.rounds > 1:
        return []
    layers = contract_layers() if layers is None else layers
    shapes = {k: tuple(v.shape[1:]) for k, v in layers.items()}
    n = sum(int(np.prod(s, dtype=np.int64)) for s in shapes.values())
    if not callable(getattr(codec, "bits_per_element", None)):
        return ["no bits_per_element(layers_or_shapes)"]
    declared = codec.bits_per_element(shapes)
    errors = []
    if codec.bits_per_element({k: v[0] for k, v in layers.items()}) != declared:
        errors.append("bits_per_element of one worker's arrays differs from that of their shapes")
    exact = getattr(codec, "bits_exact", True)
    for w, m in enumerate(encode(codec, layers)):
        measured = 8.0 * len(m.to_bytes()) / n
        if measured != declared if exact else measured > declared:
            errors.append(f"worker {w}: {measured!r} bits per element on the wire, bits_per_element says "
                          f"{declared!r}" + ("" if exact else " (the largest message)"))
    return errors


def single_encode_errors(codec, layers: dict | None = None) -> list[str]:
    """Where the single-worker API of `codec` differs from the batched one on `layers` (W, *shape;
    default contract_layers()), one line each ([] when it does not): `encode(layers_w, StreamKey(seed,
    step, w))` gives the bytes of worker w's message of `encode_many` (own statistics) and `decode`
    reads it. For a codec of R > 1 rounds, whose rounds average over the workers, `encode` is worker w
    alone (the rounds' means are its own): checked only that `decode` gives every layer in its shape."""
    from tgsim.rng import StreamKey

    if not callable(getattr(codec, "encode", None)):
        return ["no encode(layers, key)"]
    layers = contract_layers() if layers is None else layers
    if codec.properties.rounds > 1:
        out = codec.decode(codec.encode({k: v[0] for k, v in layers.items()}, StreamKey(2024, 3, 0)))
        return [f"layer {k}: decode of encode's message has shape {np.shape(out.get(k))}, not {v.shape[1:]}"
                for k, v in layers.items() if np.shape(out.get(k)) != v.shape[1:]]
    batch = codec.encode_many(layers, 2024, 3, np.arange(WORKERS), None, codec.prepare_many(layers))
    errors = []
    for w in range(WORKERS):
        m = codec.encode({k: v[w] for k, v in layers.items()}, StreamKey(2024, 3, w))
        if m.to_bytes() != batch[w].to_bytes():
            errors.append(f"worker {w}: encode gives other bytes than encode_many's row")
        elif not _same_bits(codec.decode(m), codec.decode(batch[w])):
            errors.append(f"worker {w}: decode of encode's message differs")
    return errors


class CodecContract:
    """Generic checks of the codec protocol (tgsim.codecs.base), run on the `codec` fixture."""

    @pytest.fixture
    def codec(self):  # pragma: no cover - provided by the subclass
        raise NotImplementedError("subclasses provide the codec under test")

    def test_declares_its_properties(self, codec):
        assert isinstance(codec.properties, CodecProperties)
        assert isinstance(codec.name, str) and codec.name

    def test_declared_capabilities_are_implemented(self, codec):
        """`capability_errors` finds nothing: each declared capability has its methods, and they work
        on the contract's layers."""
        assert capability_errors(codec) == []

    def test_bits_per_element_counts_the_wire(self, codec):
        """`bits_errors` finds nothing: bits_per_element is 8 len(to_bytes()) / elements."""
        assert bits_errors(codec) == []

    def test_single_worker_encode_is_the_batched_row(self, codec):
        """`single_encode_errors` finds nothing: encode(layers, key) is encode_many's row."""
        assert single_encode_errors(codec) == []

    def test_round_trip_through_bytes(self, codec):
        layers = contract_layers()
        msgs = encode(codec, layers)
        again = encode(codec, layers)
        assert len(msgs) == WORKERS
        for m, m2 in zip(msgs, again):
            buf = m.to_bytes()
            assert buf == m2.to_bytes(), "the same keys must give the same bytes"
            assert m.wire_bytes == len(buf)
            got = codec.decode(codec.from_bytes(buf, m))
            want = codec.decode(m)
            assert _same_bits(got, want)
            assert {k: np.shape(v) for k, v in want.items()} == {k: v.shape[1:] for k, v in layers.items()}

    @pytest.mark.parametrize("damage", ["truncated", "extended", "first byte"])
    def test_malformed_bytes_raise_payload_error(self, codec, damage):
        m = encode(codec, contract_layers())[0]
        buf = bytearray(m.to_bytes())
        if damage == "truncated":
            buf = buf[:-1]
        elif damage == "extended":
            buf += b"\0"
        else:
            buf[0] ^= 0xFF
        if damage == "first byte" and codec.properties.float_mean:
            pytest.skip("raw float32 bytes have no header: any first byte is a valid value")
        with pytest.raises(PayloadError):
            codec.from_bytes(bytes(buf), m)

    def test_nonfinite_gradient_is_refused_naming_the_layer(self, codec):
        layers = contract_layers()
        layers["t"][1, 17] = np.nan
        with pytest.raises(NonFiniteGradientError, match="'t'"):
            codec.prepare_many(layers)

    def test_aggregate_combines_the_decodes_as_declared(self, codec):
        """combine "mean": bit for bit the ordered mean of the decodes; "majority": their vote."""
        msgs = encode(codec, contract_layers())
        decoded = [codec.decode(m) for m in msgs]
        if codec.properties.combine == "majority":
            want = {k: np.sign(sum(np.asarray(d[k], np.float64) for d in decoded)).astype(np.float32)
                    for k in decoded[0]}
        else:
            want = ordered_mean(decoded, WORKERS)
        assert _same_bits(codec.aggregate(msgs, divide_by=WORKERS), want)

    def test_declared_unbiasedness_is_true(self, codec):
        """alpha = 1e-3 (two projections), seed 99, R = 400 draws of a Student-t(3) vector of 400; for
        a codec declared biased that the vector does not reject, the same 400 values as a 20 x 20
        matrix too (a codec that compresses matrices only, as PowerSGD, sends a vector exactly)."""
        g = np.random.default_rng(5).standard_t(3, 400).astype(np.float32)
        rejected = unbiasedness_rejects(codec, g)
        if not rejected and not codec.properties.unbiased:
            rejected = unbiasedness_rejects(codec, g.reshape(20, 20))
        assert rejected == (not codec.properties.unbiased), \
            f"{codec.name} declares unbiased={codec.properties.unbiased}"

    def test_a_biased_copy_is_rejected(self, codec):
        """Positive control: the same codec with every decoded value 5 % too large is rejected, where
        the test can see 5 % (power 0.99 at R = 400); a codec too noisy for that on this vector of 400
        (e.g. random sparsification keeping 4 elements) is skipped, saying what the test can see."""
        g = np.random.default_rng(6).standard_t(3, 400).astype(np.float32)
        power: list = []
        rejected = unbiasedness_rejects(codec, g, scale=1.05, power_out=power)
        if power and power[0] > 0.05 and not rejected:
            pytest.skip(f"{codec.name}: on this vector the 400-draw test detects |bias| >= {power[0]:.1%} with "
                        "power 0.99, not 5 %; the pooled test covers it where it can")
        assert rejected

    # -- the pooled test with a stated power (unbiased codecs) ------------------------------------
    def test_pooled_test_accepts_and_its_positive_controls_are_rejected(self, codec):
        """alpha = 1e-3, power 0.99, seed 11, Gaussian layer of 20,000 (seed 13): the codec passes;
        1 % uniform bias and a floor zeroing |g| < q_10(|g|) are rejected; each result states the
        smallest bias it detects."""
        if not codec.properties.unbiased:
            pytest.skip(f"{codec.name} declares itself biased: the positive controls test unbiased codecs")
        g = np.random.default_rng(13).standard_normal(POOLED_N).astype(np.float32)
        res = pooled_controls(codec, g, POOLED_DELTA)
        assert not res["codec"].reject, res["codec"].table()
        assert res["bias"].reject, res["bias"].table()
        assert res["floor"].reject, res["floor"].table()


def pooled_draws_needed(codec, g: np.ndarray, delta: float, seed: int = 11) -> tuple[int, str]:
    """(R, note) for `codec` on the layer g: the draws at which a pilot of POOLED_PILOT draws (seeded
    from `seed`) says |bias| >= 0.75 delta is detected in directions g and sign(g) with power 0.99;
    the note says what POOLED_MAX_DRAWS would detect when R is above it."""
    from tgsim.analysis.pooled_bias import decoded_draws, directions, draws_needed, pooled_bias_test

    g = np.asarray(g, np.float32).reshape(-1)
    u = directions(g)
    dirs = np.stack([u["g"], u["sign(g)"]])
    target = dirs @ g.astype(np.float64)
    pilot = decoded_draws(codec, g, 0, POOLED_PILOT, seed + 1) @ dirs.T
    draws = max(POOLED_PILOT, draws_needed(pilot.std(axis=0, ddof=1), target, 0.75 * delta))
    at_max = pooled_bias_test(pilot, target).min_detectable.max() * np.sqrt(POOLED_PILOT / POOLED_MAX_DRAWS)
    return draws, (f"{codec.name}: {draws} draws needed to see a {delta:.1%} bias; with {POOLED_MAX_DRAWS} "
                   f"the smallest detectable bias is about {at_max:.2%}")


def pooled_controls(codec, g: np.ndarray, delta: float, seed: int = 11, draws: int | None = None) -> dict:
    """The pooled test (tgsim.analysis.pooled_bias) of `codec` on layer g, and of two biased copies
    on the same draws (seeded from `seed`): "bias" multiplies every decoded value by 1 + delta; "floor"
    zeroes the coordinates with |g| below the 10th percentile of |g|. R (`draws`) defaults to what a
    pilot of POOLED_PILOT draws says detects |bias| >= 0.75 delta in directions g and sign(g) with power
    0.99 (pytest.skip above POOLED_MAX_DRAWS). Returns {"codec"|"bias"|"floor": PooledBiasResult}."""
    from tgsim.analysis.pooled_bias import decoded_draws, deterministic_draw, directions, pooled_bias_test

    g = np.asarray(g, np.float32).reshape(-1)
    u = directions(g)
    names = tuple(u)
    dirs = np.stack([u[k] for k in names])
    target = dirs @ g.astype(np.float64)
    floor = np.abs(g) < np.quantile(np.abs(g), 0.10)
    variants = {"codec": lambda v: v, "bias": lambda v: v * (1.0 + delta), "floor": lambda v: np.where(floor, 0.0, v)}
    if deterministic_draw(codec, g, seed + 1) is not None:
        pytest.skip(f"{codec.name} is deterministic: the exact comparison of test_declared_unbiasedness_is_true "
                    "covers it")
    if draws is None:
        draws, note = pooled_draws_needed(codec, g, delta, seed)
        if draws > POOLED_MAX_DRAWS:
            pytest.skip(note)
    proj = {k: np.empty((draws, len(names))) for k in variants}
    for first in range(0, draws, 32):
        count = min(32, draws - first)
        v = decoded_draws(codec, g, first, count, seed)
        for k, f in variants.items():
            proj[k][first:first + count] = f(v) @ dirs.T
    return {k: pooled_bias_test(p, target, names) for k, p in proj.items()}
