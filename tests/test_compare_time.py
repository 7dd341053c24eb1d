"""`tgsim compare time` (issue 19, item 4): the CSVs of its --quick form, the measured wire against the
codecs' own byte formulas, and the step-time model with a measured `Wire` against the model's
formula path. The quick command runs once (module fixture, ~25 s on the 2-core test machine: it runs
`compare bits --quick` for the convnet first, seed 0)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tgsim.analysis import compare_time as ct
from tgsim.analysis.perfmodel_verdict import best_float_speedups
from tgsim.analysis.perfmodel_throughput import CLUSTERS, Exchange, Wire, iteration, uint_width
from tgsim.cli import main


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare-time")
    assert main(["compare", "time", "--quick", "--out", str(out)]) == 0
    return out, {n: pd.read_csv(out / f"{n}.csv") for n in ("time_wire", "time_codec", "time", "time_patterns")}


def test_quick_writes_csvs_and_figure(timed):
    out, t = timed
    df = t["time"]
    assert list(df.columns) == ct.COLUMNS
    assert (out / "time.png").stat().st_size > 10_000
    assert set(df.net) == {"alexnet", "resnet50"} and set(df.workers) == {8, 64, 512}
    assert set(df.link_gbps) == {1, 10, 100} and set(df.rule) == {"fp32-lr", "own-lr"}
    assert set(df.method) == {"fp32", "fp16", "bf16", "terngrad", "topk+ef"}
    assert set(df.hardware) == {"p100-fp32", "h100-amp"} and set(df.scaling) == {"weak"}
    assert not df.duplicated(["rule", "hardware", "net", "link_gbps", "workers", "method"]).any()
    np.testing.assert_allclose(df.time_to_target, df.K * df.t_step)
    assert (df[df.method == "fp32"].speedup_fp32 == 1.0).all()
    # the best float baseline is the fastest of fp32/fp16 in each setting, so no float beats it
    assert (df[df.method.isin(["fp32", "fp16"])].speedup_best <= 1.0 + 1e-12).all()
    # a step never takes less than its computation
    assert (df.t_step >= df.compute - 1e-12).all()


def test_measured_wire_matches_the_codecs_formulas(timed):
    """TernGrad's ps uplink is 2 bits an element plus a small header; its downlink is the server's sum
    at ceil(log2(2N+1)) bits an element; its sharded_ps the same message and answer, of which a worker
    sends (N-1)/N of each (the real mode's count, 2 (N-1) 8-byte block headers aside); fp32/fp16
    rings carry 4/2 bytes; topk+ef sends 1 % of the elements as (index, value) pairs."""
    _, t = timed
    w = t["time_wire"].set_index(["method", "workers", "pattern"])
    n = int(t["time_wire"].elements.iloc[0])
    for N in (8, 64, 512):
        up, down = w.loc[("terngrad", N, "ps"), ["up", "down"]]
        assert 0.25 <= up < 0.25 * 1.05
        assert uint_width(N) / 8 <= down < uint_width(N) / 8 * 1.05
        assert tuple(w.loc[("terngrad", N, "sharded_ps"), ["up", "down"]]) == (up, down)
        sent = w.loc[("terngrad", N, "sharded_ps"), "sent"]
        heads = 2 * (N - 1) * 8 / n
        assert (N - 1) / N * (0.25 + uint_width(N) / 8) <= sent <= (N - 1) / N * (up + down) + heads, (N, sent)
        assert ("topk+ef", N, "sharded_ps") not in w.index
        assert w.loc[("fp32", N, "ring"), "reduce"] == 4 and w.loc[("fp16", N, "ring"), "reduce"] == 2
        assert 0.01 * 4 <= w.loc[("topk+ef", N, "allgather"), "up"] <= 0.01 * 8 * 1.1


def test_rows_say_which_server_and_both_servers_are_listed(timed):
    """time.csv says which pattern and server each row assumes; time_patterns.csv lists TernGrad in
    both parameter servers at every setting: "ps" = rank 0's one server (the code's ps mode), whose
    step grows with N, "sharded_ps" = one shard per worker, faster at N = 512 on 1 Gb/s and flatter
    from N = 8 to 512. A codec whose codes do not sum exactly has no sharded_ps."""
    from tgsim.codecs import registry

    _, t = timed
    df, pt = t["time"], t["time_patterns"]
    assert list(pt.columns[:6]) == ["hardware", "net", "link_gbps", "workers", "method", "codec_options"]
    servers = {"ring": {"none"}, "allgather": {"none"}, "ps": {"rank 0"}, "sharded_ps": {"sharded over the workers"}}
    for pat, group in df.groupby("pattern"):
        assert set(group.server) == servers[pat], pat
    tg = pt[pt.method == "terngrad"]
    assert set(tg.pattern) == {"ps", "sharded_ps", "allgather", "ring"}
    assert set(tg[tg.pattern == "ps"].algorithm) == {"ps(rank 0)"}
    assert set(tg[tg.pattern == "sharded_ps"].algorithm) == {"sharded_ps"}
    assert len(tg.groupby(["hardware", "net", "link_gbps", "workers"])) == len(df.groupby(["hardware", "net",
                                                                                          "link_gbps", "workers"]))
    one = tg[(tg.link_gbps == 1) & (tg.net == "alexnet") & (tg.hardware == "p100-fp32")]
    step = one.pivot_table(index="pattern", columns="workers", values="t_step")
    assert step.loc["ps", 512] > 2 * step.loc["sharded_ps", 512]
    assert step.loc["ps", 512] / step.loc["ps", 8] > 2 * step.loc["sharded_ps", 512] / step.loc["sharded_ps", 8]
    assert "sharded_ps" not in set(pt[pt.method == "topk+ef"].pattern)
    assert "sharded_ps" in ct.patterns(registry.make("terngrad"))
    assert "sharded_ps" not in ct.patterns(registry.make("terngrad", sharing="none"))
    lines = ct.server_lines(pt)
    assert lines and lines[0].startswith("terngrad") and "ps (rank 0)" in lines[1] and "sharded_ps" in lines[1]


def test_codec_cost_is_measured_and_counted(timed):
    _, t = timed
    c = t["time_codec"].set_index("method")
    floats = ["fp32", "fp16", "bf16"]
    assert (c.loc[floats, "encode_host"] == 0).all() and (c.drop(floats).encode_host > 0).all()
    # a GPU figure only where that codec was timed on a GPU; every other codec its own host seconds
    np.testing.assert_allclose(c.loc["terngrad", "encode_used"], ct.GPU_TERNGRAD_ENCODE)
    assert c.loc["terngrad", "cost_source"] == "gpu (H100)" and c.loc["topk+ef", "cost_source"] == "host"
    np.testing.assert_allclose(c.loc["topk+ef", ["encode_used", "decode_used"]].astype(float),
                               c.loc["topk+ef", ["encode_host", "decode_host"]].astype(float))
    df = t["time"]
    assert (df[df.method == "terngrad"].codec_seconds > 0).all()


def test_a_wire_built_from_the_formulas_gives_the_formula_path():
    """Oracle: `iteration` with a Wire holding fp32's formula bytes and no codec seconds equals the
    string path, for every pattern; a Wire's decode seconds follow the docstring's counts."""
    cl = CLUSTERS["ethernet"]
    for G in (2, 8, 64):
        wire = Wire("fp32", {G: {"up": 4.0, "down": 4.0, "reduce": 4.0}})
        for pat in ("ps", "ring", "allgather"):
            ex = Exchange(pat, servers=0)
            a, b = iteration("alexnet", wire, G, cl, ex), iteration("alexnet", "fp32", G, cl, ex)
            assert math.isclose(a["iteration"], b["iteration"], rel_tol=1e-12), (G, pat)
    w = Wire("x", {}, encode=1e-9, decode=2e-9)
    assert math.isclose(w.decode_seconds(100, 16, Exchange("ps", servers=0), nodes=4), 2e-9 * 100 * (16 / 4 + 1))
    assert math.isclose(w.decode_seconds(100, 16, Exchange("allgather"), nodes=4), 2e-9 * 100 * 15)
    assert math.isclose(w.decode_seconds(100, 16, Exchange("ring"), nodes=4), 2e-9 * 100)


def test_codec_seconds_lengthen_the_step_where_the_exchange_is_exposed():
    """Positive control: the same bytes with encode/decode seconds give a longer step on 1 Gb/s."""
    cl = CLUSTERS["ethernet"]
    per = {8: {"up": 0.25, "down": 0.5, "reduce": 1.0}}
    free = iteration("alexnet", Wire("t", per), 8, cl, Exchange("ps", servers=0))
    paid = iteration("alexnet", Wire("t", per, encode=1e-9, decode=1e-9), 8, cl, Exchange("ps", servers=0))
    assert paid["iteration"] > free["iteration"] and paid["codec_seconds"] > 0 == free["codec_seconds"]


def test_steps_to_target_needs_every_seed():
    runs = pd.DataFrame(dict(problem="convnet", rule="fp32-lr", method=["a", "a", "b", "b"], lr=0.1,
                             seed=[0, 1, 0, 1], K=[10.0, 14.0, 10.0, np.nan]))
    s = ct.steps_to_target(runs).set_index("method")
    assert s.loc["a", "K"] == 12.0 and np.isnan(s.loc["b", "K"])
    assert s.loc["a", "K_seed"] == {0: 10.0, 1: 14.0}


def test_speedup_over_the_best_float_is_a_paired_log_ratio_interval():
    """Seeds 0, 1: fp32 takes 10, 20 steps, fp16 12, 14, the codec 5, 10; step times fp32 1.0, fp16 0.5,
    codec 0.5. Best float by mean time: fp16 (6.5 < 15). Per seed r = K16 x 0.5 / (K x 0.5): 2.4, 1.4;
    speedup = their geometric mean, the interval exp(mean log r -+ t_{0.975,1} sd / sqrt 2)."""
    from scipy import stats

    steps = pd.DataFrame(dict(rule="r", method=["fp32", "fp16", "c"], K_seed=[{0: 10.0, 1: 20.0}, {0: 12.0, 1: 14.0},
                                                                             {0: 5.0, 1: 10.0}]))
    df = pd.DataFrame(dict(rule="r", net="n", link_gbps=1, workers=8, method=["fp32", "fp16", "c"],
                           t_step=[1.0, 0.5, 0.5]))
    out = best_float_speedups(df, steps, ("fp32", "fp16"))
    r = np.log([2.4, 1.4])
    h = stats.t.ppf(0.975, 1) * r.std(ddof=1) / math.sqrt(2)
    assert list(out.best_float) == ["fp16"] * 3
    np.testing.assert_allclose(out.loc[2, ["speedup_best", "speedup_best_lo", "speedup_best_hi"]].astype(float),
                               np.exp([r.mean(), r.mean() - h, r.mean() + h]))
    assert math.isclose(out.loc[1, "speedup_best"], 1.0) and not out.win.any()     # wide: 2 seeds straddle 1
    steps.at[2, "K_seed"] = {0: 5.0, 1: float("nan")}
    assert math.isnan(best_float_speedups(df, steps, ("fp32", "fp16")).speedup_best[2])


def test_quick_consuming_quick_is_marked(timed):
    """`compare time --quick` runs compare bits --quick into OUT/bits-quick (marked quick; with fp32,
    fp16 and bf16) and marks its own CSVs quick, whether it ran that step or read it back."""
    out, t = timed
    assert pd.read_csv(out / "bits-quick" / "bits_runs.csv").quick.all()
    for df in t.values():
        assert df.quick.all()
    assert ct.figure_title("own-lr", True).startswith("QUICK") and "QUICK" not in ct.figure_title("own-lr", False)


def _bits_dir(path, quick):
    """A bits_runs.csv by hand: fp32, fp16, bf16 and terngrad, 2 seeds, convnet, both rules."""
    path.mkdir()
    rows = [dict(problem="convnet", rule=rule, method=m, seed=s, lr=0.1, steps=30, K=k + s, quick=quick)
            for rule in ("fp32-lr", "own-lr") for m, k in (("fp32", 20), ("fp16", 21), ("bf16", 22), ("terngrad", 24))
            for s in (0, 1)]
    pd.DataFrame(rows).to_csv(path / "bits_runs.csv", index=False)
    return path


def test_quick_bits_are_refused_without_allow_quick(tmp_path, capsys):
    """A quick bits_runs.csv: exit 2 and one line on stderr naming the file and --allow-quick, nothing
    written; an unmarked one (or one without the column: an older tgsim) is read."""
    bits = _bits_dir(tmp_path / "bits", True)
    out = tmp_path / "time"
    assert main(["compare", "time", "--bits", str(bits), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--quick" in err[0] and "--allow-quick" in err[0] and str(bits) in err[0], err
    assert not out.exists()
    with pytest.raises(ct.QuickInputError):
        ct.read_bits_runs(bits / "bits_runs.csv")
    runs, quick = ct.read_bits_runs(bits / "bits_runs.csv", allow_quick=True)
    assert quick and len(runs) == 16
    full = _bits_dir(tmp_path / "full", False)
    assert ct.read_bits_runs(full / "bits_runs.csv")[1] is False
    pd.read_csv(full / "bits_runs.csv").drop(columns="quick").to_csv(full / "bits_runs.csv", index=False)
    assert ct.read_bits_runs(full / "bits_runs.csv")[1] is False


def test_allow_quick_marks_the_output(tmp_path, capsys):
    """--allow-quick on a quick bits_runs.csv (not a quick run itself): every CSV has quick = True and
    the printed tables say QUICK; the same steps unmarked give quick = False and no QUICK."""
    small = dict(nets=("alexnet",), workers=(8,), n_wire=1 << 10, n_cost=1 << 12, hardware=("p100-fp32",))
    res = ct.run(tmp_path / "t1", bits=_bits_dir(tmp_path / "b1", True), allow_quick=True, **small)
    printed = capsys.readouterr().out
    assert all(df.quick.all() for df in res.values())
    assert all(r.quick for r in (pd.read_csv(tmp_path / "t1" / f"{n}.csv") for n in res)
               for r in r.itertuples())
    assert printed.count("QUICK own-lr") == 2 and printed.count("QUICK fp32-lr") == 2 and ct.QUICK_MARK in printed
    res = ct.run(tmp_path / "t2", bits=_bits_dir(tmp_path / "b2", False), **small)
    assert not any(df.quick.any() for df in res.values()) and "QUICK" not in capsys.readouterr().out


def test_a_multi_round_codecs_bytes_are_its_own_count_on_the_layer_shapes():
    """PowerSGD (properties.rounds = 2): its bytes per element are measured on a 1-D layer (4 bytes,
    float32), but on AlexNet's real layers the modeled bytes of each layer equal its
    bits_per_element(the layer's parameter shapes) / 8 x params, the rank-r factors of both rounds;
    the whole net's too. Positive control: the 1-D measurement alone (4 bytes an element) differs."""
    from tgsim.analysis.perfmodel_nets import get_net
    from tgsim.codecs import registry

    wire = ct.measure_wire(["powersgd"], workers=(8,), n=1 << 10)
    assert list(wire.pattern) == ["ring"] and wire.reduce.iloc[0] == 4.0      # a float-mean codec: its ring
    w = ct._wire("powersgd", wire, "ring", 0.0, 0.0)
    assert w.rounds == 2
    codec, net = registry.make("powersgd"), get_net("alexnet")
    modeled = [w.layer_bytes(layer.params, 8, layer.shapes)["reduce"] for layer in net.layers]
    own = [codec.bits_per_element({str(i): s for i, s in enumerate(layer.shapes)}) / 8 * layer.params
           for layer in net.layers]
    np.testing.assert_allclose(modeled, own, rtol=1e-12)
    all_shapes = {f"{layer.name}/{i}": s for layer in net.layers for i, s in enumerate(layer.shapes)}
    assert math.isclose(sum(modeled), codec.bits_per_element(all_shapes) / 8 * net.params, rel_tol=1e-12)
    assert sum(modeled) < 0.1 * 4 * net.params       # the 1-D measurement alone would be 4 bytes an element


def test_a_multi_round_codec_pays_its_latency_once_per_round(monkeypatch):
    """A fake codec of properties.rounds = 3 (a stand-in for the registry's codec of that label): its
    Wire has 3 rounds, and each layer's exchange pays the pattern's latency terms 3 times: with the
    same bytes, a step without overlap (compute + every message in turn) is longer than the 1-round
    one by exactly 2 x Σ_layers latencies: ps 2 a (uplink and downlink), ring 2 (G-1) a, all-gather
    (G-1) a. The latency alone: the bytes are the same."""
    from types import SimpleNamespace

    from tgsim.analysis.perfmodel_nets import get_net
    from tgsim.codecs.base import CodecProperties

    fake = SimpleNamespace(properties=CodecProperties(unbiased=False, float_mean=True, stateful=True, rounds=3),
                           bits_per_element=lambda shapes: 32.0)
    monkeypatch.setattr(ct, "_codec", lambda method: fake)
    assert ct.rounds("fake3") == 3
    G, cl, net = 16, CLUSTERS["ethernet"], get_net("alexnet")
    per = {G: {"up": 0.5, "down": 0.5, "reduce": 0.5}}
    rows = pd.DataFrame([dict(method="fake3", workers=G, pattern=p, elements=1 << 10, **per[G])
                         for p in ("ps", "ring", "allgather")])
    lat = cl.network.latency
    for pat, terms in (("ps", 2), ("ring", 2 * (G - 1)), ("allgather", G - 1)):
        three = ct._wire("fake3", rows, pat, 0.0, 0.0)
        one = Wire("one", per)
        assert three.rounds == 3 and one.rounds == 1
        ex = Exchange(pat, servers=0, overlap=False)
        t3, t1 = iteration(net, three, G, cl, ex)["iteration"], iteration(net, one, G, cl, ex)["iteration"]
        assert math.isclose(t3 - t1, 2 * terms * lat * len(net.layers), rel_tol=1e-9), pat


def test_the_nets_layer_shapes_hold_their_parameters():
    """Each layer of every net lists its parameter tensors (what a shape-dependent codec is costed on):
    their sizes sum to the layer's params; dense weights are matrices, conv weights 4-D."""
    from tgsim.analysis.perfmodel_nets import NETS

    for name, make in NETS.items():
        for layer in make().layers:
            assert layer.shapes and sum(math.prod(s) for s in layer.shapes) == layer.params, (name, layer.name)
            assert all(len(s) in ((2, 1) if layer.kind == "fc" else (4, 1)) for s in layer.shapes), (name, layer.name)
