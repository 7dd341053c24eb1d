"""Error feedback as a wrapper of any codec (tgsim/codecs/error_feedback.py, `[codec] error_feedback`):
the residual invariant per codec, the loop's residuals, EF-signSGD against signSGD on least squares,
kill + resume with the residuals, the combinations refused, and the unbiasedness table's EF rows.
MPI: tests/test_mpi_error_feedback.py."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from fakes import kill_train_step_at
from tgsim.codecs import error_feedback, error_feedback as ef, registry
from tgsim.codecs.base import CodecProperties
from tgsim.errors import ConfigError
from tgsim.testing import contract_layers, encode
from tgsim.train import checkpoint
from tgsim.train.config import CodecConfig, from_dict
from tgsim.train.loop import build, local_batch, run, train_step

WRAPPABLE = [n for n in registry.names()          # error feedback wraps the stateless codecs combined by the mean
             if (props := registry.make_codec(dataclasses.replace(CodecConfig(), name=n)).properties).combine == "mean"
             and not props.stateful]


def ef_codec(name: str, **options):
    return error_feedback.ErrorFeedback(registry.make_codec(CodecConfig(name=name, options=options)))


def bits(a) -> bytes:
    return np.ascontiguousarray(np.asarray(a, np.float32)).tobytes()


def tree_bits(d: dict) -> dict:
    return {k: bits(v) for k, v in d.items()}


# -- the math ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", WRAPPABLE)
def test_sent_plus_new_residual_is_the_compensated_gradient(name):
    """The epfml/powersgd invariant, two steps of 3 workers (heavy tails, a zero layer, odd sizes; the
    codec's default config, shared statistics where it has them): D(C(p)) + e' == p, in float64 up to
    the one float32 rounding of e' = fl(p - D): |D + e' - p| <= 2^-24 |p - D| per element (exactly 0
    for fp32, whose residual stays 0). The second step starts from the first step's residual."""
    codec = ef_codec(name)
    layers = contract_layers()
    residual = error_feedback.zeros({k: v.shape[1:] for k, v in layers.items()}, 3)
    for step in range(2):
        grads = {k: v * np.float32(1 + step) for k, v in layers.items()}
        p = error_feedback.compensate(grads, residual)
        decoded = [codec.decode(m) for m in encode(codec, p, step=step)]
        residual = error_feedback.new_residual(p, decoded)
        for k in layers:
            d = np.stack([np.asarray(x[k], np.float64) for x in decoded])
            e, pk = residual[k].astype(np.float64), p[k].astype(np.float64)
            assert residual[k].dtype == np.float32 and residual[k].shape == layers[k].shape
            assert np.all(np.abs(d + e - pk) <= 2.0 ** -24 * np.abs(pk - d)), (name, step, k)
            if error_feedback.lossless(codec.properties):
                assert not e.any(), "a lossless codec leaves no residual"
    assert any(v.any() for v in residual.values()) != error_feedback.lossless(codec.properties)


def test_property_rule():
    """EF-wrapped codecs are stateful and biased (fp32's: unbiased, it is the identity); the rest of
    the inner codec's declaration (wire, sharing, ...) is kept."""
    for name in WRAPPABLE:
        inner = registry.make_codec(dataclasses.replace(CodecConfig(), name=name)).properties
        props = ef_codec(name).properties
        assert props.stateful and props.unbiased == (name == "fp32"), name
        assert dataclasses.replace(props, stateful=False, unbiased=inner.unbiased) == inner
    assert ef_codec("qsgd").name == "qsgd+ef" and error_feedback.split_name("qsgd+ef") == ("qsgd", True)


# -- the loop -------------------------------------------------------------------------------------------

MLP = {
    "run": {"name": "ef", "seed": 3, "steps": 30, "eval_every": 0, "log_every": 5, "checkpoint_every": 10},
    "data": {"name": "digits"},
    "model": {"name": "mlp", "options": {"hidden": [16]}},
    "workers": {"n": 4, "batch": 32},
    "codec": {"name": "terngrad", "error_feedback": True},
    "exchange": {"mode": "allreduce"},
    "optimizer": {"name": "momentum"},
    "schedule": {"name": "constant", "lr": 0.05},
}


def cfg_with(base=MLP, **sections):
    d = {k: dict(v) for k, v in base.items()}
    for name, values in sections.items():
        d[name] = {**d.get(name, {}), **values}
    return from_dict(d)


@pytest.mark.parametrize("codec", [{"name": "terngrad"}, {"name": "scaled_sign"}, {"name": "terngrad", "sharing": "mean"}])
def test_the_loop_keeps_each_workers_residual(codec):
    """Two steps of train_step: the residuals are e1 = g0 - D(C(g0)) and e2 = (g1 + e1) - D(C(g1 + e1)),
    bit for bit, each worker its own (recomputed outside the loop from the same batches and keys,
    with the shared scaler the loop computes: the max or mean of the 4 workers' over p)."""
    setup = build(cfg_with(codec=codec, exchange={"mode": "ps"}))
    inner = setup.codec.inner
    params = setup.model.init(3)
    opt = setup.optimizer.init(params)
    state = setup.codec.init_state(setup.model.layer_shapes(), 4)
    expect = error_feedback.zeros(setup.model.layer_shapes(), 4)
    for step in range(2):
        x, y = local_batch(setup, step)
        _, g = setup.model.loss_and_grad(params, x, y)
        p = error_feedback.compensate(g, expect)
        stats = inner.prepare_many(p)
        shared = None
        if inner.properties.shared_stats is not None:
            local = inner.local_scalers_many(stats, 4)
            shared = setup.exchange.max_scalers(local) if inner.properties.shared_stats == "max" \
                else setup.exchange.mean_scalers(local)
        msgs = inner.encode_many(p, 3, step, np.arange(4), shared, stats)
        expect = error_feedback.new_residual(p, [inner.decode(m) for m in msgs])
        params, opt, _ = train_step(setup, params, opt, step, with_stats=step == 1, codec_state=state)
        residual = error_feedback.residuals(state)
        assert tree_bits(residual) == tree_bits(expect), step
        assert not np.array_equal(residual["fc1.w"][0], residual["fc1.w"][1]), "workers hold their own residuals"
    with pytest.raises(ValueError, match="stateful"):
        train_step(setup, params, opt, 2)


@pytest.mark.parametrize("sections", [
    {},                                                                        # terngrad, integer all-reduce
    {"codec": {"name": "scaled_sign", "error_feedback": True}, "exchange": {"mode": "ps"}},   # EF-signSGD
], ids=["terngrad-allreduce", "scaled_sign-ps"])
def test_kill_and_resume_gives_the_bits_of_an_uninterrupted_run(tmp_path, monkeypatch, sections):
    """A run killed at step 27 (checkpoints at 10 and 20) resumes from step 20 with every worker's
    residual and ends with the uninterrupted run's parameters; resuming with the residuals zeroed
    gives other bits (the residuals are state the checkpoint must hold), and a checkpoint without
    them is refused."""
    cfg = cfg_with(**sections)
    full = run(cfg, out=tmp_path / "full", quiet=True)
    kill_train_step_at(monkeypatch, 27)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, out=tmp_path / "killed", quiet=True)
    monkeypatch.undo()
    ckpts = checkpoint.list_checkpoints(tmp_path / "killed" / "checkpoints")
    assert [p.name for p in ckpts] == ["ckpt-00000010.tgck", "ckpt-00000020.tgck"]
    saved = error_feedback.residuals(checkpoint.flatten(checkpoint.read(ckpts[-1])["codec_state"]))
    assert {k: v.shape for k, v in saved.items()} == {k: (4, *s) for k, s in build(cfg).model.layer_shapes().items()}
    again = run(cfg, out=tmp_path / "killed", resume=True, quiet=True)
    assert again.start_step == 20
    assert tree_bits(again.params) == tree_bits(full.params)

    # the same checkpoint with the residuals zeroed, and without them
    state = checkpoint.read(ckpts[-1])
    state["codec_state"] = {k: np.zeros_like(v) for k, v in checkpoint.flatten(state["codec_state"]).items()}
    checkpoint.save(tmp_path / "zeroed" / "checkpoints", 20, state)
    (tmp_path / "zeroed" / "config.toml").write_bytes((tmp_path / "killed" / "config.toml").read_bytes())
    zeroed = run(cfg, out=tmp_path / "zeroed", resume=True, quiet=True)
    assert tree_bits(zeroed.params) != tree_bits(full.params)
    del state["codec_state"]
    checkpoint.save(tmp_path / "none" / "checkpoints", 20, state)
    with pytest.raises(ConfigError, match="holds none"):
        run(cfg, out=tmp_path / "none", resume=True, quiet=True)


def test_combinations_that_cannot_work_fail_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="majority vote"):
        run(cfg_with(codec={"name": "sign", "error_feedback": True}, exchange={"mode": "ps"}), out=tmp_path / "x",
            quiet=True)
    assert not (tmp_path / "x").exists()
    with pytest.raises(ConfigError, match="true or false"):
        cfg_with(codec={"error_feedback": 1})


# -- EF-signSGD converges where signSGD does not -------------------------------------------------------------

LSQ = {
    "run": {"name": "lsq", "seed": 0, "steps": 300, "eval_every": 0, "log_every": 10, "checkpoint_every": 0},
    # noise 0: every worker's shard has the optimum w* (no heterogeneity floor at constant lr), cond 10
    "data": {"name": "least_squares", "options": {"noise": 0.0, "cond": 10.0}},
    "model": {"name": "least_squares"},
    "workers": {"n": 4, "batch": 1024},           # each worker's whole shard of 256: full-batch gradients
    "codec": {"name": "sign"},
    "exchange": {"mode": "ps"},
    "optimizer": {"name": "sgd"},
    "schedule": {"name": "constant", "lr": 0.5},
}


def _distances(tmp_path, tag, **sections):
    import pandas as pd

    res = run(cfg_with(LSQ, **sections), out=tmp_path / tag, quiet=True)
    m = pd.read_csv(tmp_path / tag / "metrics.csv")
    m = m[(m.split == "train") & (m.layer == "model")].dropna(subset=["dist_opt"])
    return res.dist_opt, m[m.step > 150].dist_opt


def test_ef_signsgd_converges_on_least_squares_where_signsgd_does_not(tmp_path):
    """Least squares (dim 32 + intercept, condition number 10, no label noise), 4 workers, full-batch
    gradients, SGD at a constant learning rate, 300 steps; ||w - w*|| / ||w*|| measured:

        signSGD, majority vote (`sign`), lr 0.5     0.294 at step 300; 0.294-0.300 over steps 151-300
        signSGD, majority vote, lr 0.05             0.033 at step 300; 0.025-0.033 over steps 151-300
        signSGD, majority vote, lr 0.01             5.8e-3 (a floor that shrinks with lr, a step of lr a coordinate)
        scaled sign without error feedback, lr 0.5  1.7e-2 (still 1.7e-2 .. 6.0e-2 over steps 151-300)
        EF-signSGD (scaled_sign + EF), lr 0.5       1.4e-7 (float32's floor; fp32 itself: 5.2e-7)

    signSGD moves every coordinate by ±lr (0 on a tied vote) whatever the gradient's size, so at a
    constant lr it keeps oscillating around w*; error feedback sends what earlier steps left out and
    converges like gradient descent. Asserted: signSGD at lr 0.05 and 0.5 never gets below 1e-2 in
    steps 151-300; EF-signSGD ends below 1e-5 and 100x below its distance at step 160; the scaled sign
    without EF ends above 1e-3."""
    sign_final, sign_late = _distances(tmp_path, "sign", schedule={"lr": 0.05})
    assert sign_late.min() > 1e-2 and sign_final > 1e-2, sign_late.to_list()
    sign_final, sign_late = _distances(tmp_path, "sign-big")
    assert sign_late.min() > 1e-1, sign_late.to_list()
    plain_final, _ = _distances(tmp_path, "scaled", codec={"name": "scaled_sign"})
    assert plain_final > 1e-3
    ef_final, ef_late = _distances(tmp_path, "ef", codec={"name": "scaled_sign", "error_feedback": True})
    assert ef_final < 1e-5 and ef_final < ef_late.iloc[0] / 100, ef_late.to_list()


# -- the unbiasedness table -------------------------------------------------------------------------------

def test_the_unbiasedness_table_rejects_error_feedback_codecs():
    """`tgsim analyze unbiasedness --codec all` lists "NAME+ef" for every codec EF wraps (not "sign":
    refused): each is tested at the reachable worker state e = g - D(C(g)) and rejected (fp32+ef, the
    identity, is accepted and declared unbiased); for the stochastic ones the draws' mean is g + e
    (bias_along_state ~ 1)."""
    from tgsim.analysis.unbiased_check import codec_table, error_feedback_names

    names = error_feedback_names(registry.names())
    assert "sign+ef" not in names and {"scaled_sign+ef", "qsgd+ef", "terngrad+ef", "fp32+ef"} <= set(names)
    table = codec_table(names, n=4000).set_index("codec")
    assert table["consistent"].all(), table.to_string()
    assert list(table.index[~table["reject"]]) == ["fp32+ef"], table.to_string()
    for name in ("qsgd+ef", "randomk+ef"):
        assert table.loc[name, "test"].startswith("pooled") and abs(table.loc[name, "bias_along_state"] - 1) < 0.2


@pytest.mark.mutation
def test_error_feedback_compensate_and_new_residual_by_hand():
    """compensate: p = f32(g) + e in float32 (a float64 g is rounded first: 1 + 2^-30 -> 1.0, plus
    e = 0.5 gives 1.5); new_residual: e' = p - D per worker, a flat decoded layer taken in the layer's
    shape; a residual of another shape, or a decoded-message count other than the workers', is a
    ValueError."""
    g = np.array([[[1 + 2.0**-30, -2.0], [0.25, 3.0]]], np.float64)           # W = 1, shape (2, 2)
    e = np.array([[[0.5, 0.5], [-0.25, 1.0]]], np.float32)
    p = ef.compensate({"w": g}, {"w": e})["w"]
    assert p.dtype == np.float32 and p.tolist() == [[[1.5, -1.5], [0.0, 4.0]]]
    with pytest.raises(ValueError, match="residual of shape"):
        ef.compensate({"w": g}, {"w": e.reshape(1, 4)})
    res = ef.new_residual({"w": p}, [{"w": np.array([1.0, -1.0, 0.0, 3.0])}])["w"]
    assert res.dtype == np.float32 and res.tolist() == [[[0.5, -0.5], [0.0, 1.0]]]
    with pytest.raises(ValueError, match="decoded messages"):
        ef.new_residual({"w": p}, [{"w": np.zeros(4)}] * 2)


@pytest.mark.mutation
def test_error_feedback_rows_round_trip_in_layer_order():
    """pack_rows: worker n's row is its layers flattened (C order) one after the other, float32, C
    contiguous; unpack_rows undoes it (copies), and refuses a row length other than Σ sizes (16 here)."""
    a = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    b = -np.arange(8, dtype=np.float64).reshape(2, 4)
    rows = ef.pack_rows({"a": a, "b": b})
    want = [list(range(6)) + [0.0, -1.0, -2.0, -3.0], list(range(6, 12)) + [-4.0, -5.0, -6.0, -7.0]]
    assert rows.dtype == np.float32 and rows.flags.c_contiguous and rows.tolist() == want
    back = ef.unpack_rows(rows, {"a": (2, 3), "b": (4,)})
    assert list(back) == ["a", "b"] and back["a"].tolist() == a.tolist() and back["b"].tolist() == b.tolist()
    back["a"][0, 0, 0] = 99
    assert rows[0, 0] == 0
    assert ef.unpack_rows(ef.pack_rows({}), {}) == {}      # no layers: no values per worker, round trip too
    with pytest.raises(ValueError, match="residual values per worker"):
        ef.unpack_rows(np.zeros((2, 17), np.float32), {"a": (2, 3), "b": (4,)})
    with pytest.raises(ValueError, match="residual values per worker"):
        ef.unpack_rows(np.zeros((2, 15), np.float32), {"a": (2, 3), "b": (4,)})


@pytest.mark.mutation
def test_error_feedback_local_rows_selects_and_checks_the_checkpoint():
    """local_rows: the rows of the local workers, in their order; N = 3 rows serve worker 2 (the
    highest index, N = max + 1) but not worker 3; one worker of N = 1 is fine; another layer set or
    layer shape is a ValueError."""
    saved = {"w": np.arange(12, dtype=np.float32).reshape(3, 2, 2), "b": np.arange(3, dtype=np.float32)[:, None]}
    shapes = {"w": (2, 2), "b": (1,)}
    got = ef.local_rows(saved, shapes, [2, 0])
    assert got["w"].tolist() == [saved["w"][2].tolist(), saved["w"][0].tolist()]
    assert got["b"].tolist() == [[2.0], [0.0]] and got["w"].flags.c_contiguous
    assert ef.local_rows({"b": np.ones((1, 1))}, {"b": (1,)}, [0])["b"].tolist() == [[1.0]]
    with pytest.raises(ValueError, match="expected"):
        ef.local_rows(saved, shapes, [3])
    with pytest.raises(ValueError, match="expected"):
        ef.local_rows(saved, {"w": (4,), "b": (1,)}, [0])
    with pytest.raises(ValueError, match="holds residuals of layers"):
        ef.local_rows(saved, {"w": (2, 2)}, [0])


@pytest.mark.mutation
def test_error_feedback_split_name():
    """split_name: only a trailing "+ef" marks error feedback: "qsgd" -> ("qsgd", False),
    "qsgd+ef" -> ("qsgd", True), "a+ef+ef" -> ("a+ef", True)."""
    assert ef.split_name("qsgd") == ("qsgd", False)
    assert ef.split_name("qsgd+ef") == ("qsgd", True)
    assert ef.split_name("a+ef+ef") == ("a+ef", True)


class _Inner:
    name = "fake"

    def __init__(self, **props):
        self.properties = CodecProperties(**{"unbiased": True, "wire": "own", "combine": "mean", **props})

    def decode(self, m):
        return {"m": m}


@pytest.mark.mutation
def test_error_feedback_wrapper_delegates_and_refuses_stateful_or_majority_codecs():
    """ErrorFeedback: delegates the protocol to the inner codec, is named NAME+ef, and is biased and
    stateful unless lossless (wire "float32"); a stateful inner codec or a majority-vote one is a
    ConfigError. Before __init__ has set `inner` (copy, pickle) the attribute is simply missing
    (AttributeError), not an endless __getattr__ recursion; a copy delegates like the original."""
    w = ef.ErrorFeedback(_Inner())
    assert w.name == "fake+ef" and w.decode(3) == {"m": 3}
    assert w.properties.stateful and not w.properties.unbiased
    lossless = ef.ErrorFeedback(_Inner(wire="float32"))
    assert lossless.properties.unbiased and ef.lossless(lossless.properties) and not ef.lossless(w.properties)
    assert not hasattr(object.__new__(ef.ErrorFeedback), "inner")
    assert copy.deepcopy(w).decode(4) == {"m": 4}
    with pytest.raises(ConfigError, match="keeps its own state"):
        ef.ErrorFeedback(_Inner(stateful=True))
    with pytest.raises(ConfigError, match="majority vote"):
        ef.ErrorFeedback(_Inner(combine="majority"))
    assert dataclasses.replace(w.properties, stateful=False, unbiased=True) == _Inner().properties


@pytest.mark.mutation
def test_error_feedback_rows_of_no_layers_are_an_empty_float32_buffer():
    """pack_rows of a model without layers: no worker rows and no values, a (0, 0) float32 array
    (the residual buffer of nothing); unpack_rows of it gives back no layers."""
    rows = ef.pack_rows({})
    assert rows.shape == (0, 0) and rows.dtype == np.float32
    assert ef.unpack_rows(rows, {}) == {}
