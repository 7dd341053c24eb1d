"""`tgsim compare variance | speedup` in --quick form (issue 19): the CSVs and figures they write, and
the known facts their numbers must show.

Each command runs once (module fixtures, through tgsim.cli.main, ~20 s each on the 2-core test
machine); the tests read its CSVs. Seeds are the commands' defaults (variance: seed 0; speedup:
seeds 0, 1, 2), so every outcome is reproducible.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tgsim.analysis import common
from tgsim.analysis import compare_speedup as cs
from tgsim.analysis import compare_variance as cv
from tgsim.cli import main
from tgsim.codecs import options, registry

ALPHA = 0.05           # family-wise level of the formula checks (Bonferroni over the rows checked)


@pytest.fixture(scope="module")
def variance(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare-variance")
    assert main(["compare", "variance", "--quick", "--out", str(out)]) == 0
    return out, pd.read_csv(out / "variance.csv")


@pytest.fixture(scope="module")
def speedup(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare-speedup")
    assert main(["compare", "speedup", "--quick", "--out", str(out)]) == 0
    return out, {name: pd.read_csv(out / f"{name}.csv")
                 for name in ("speedup_lr_grid", "speedup_runs", "speedup", "speedup_fit")}


def test_variance_writes_csv_and_figure(variance):
    out, df = variance
    assert list(df.columns) == cv.COLUMNS
    assert (out / "variance.png").stat().st_size > 10_000
    assert set(df.kind) == {"gaussian", "mnist1d"}
    assert set(df.codec) == set(registry.names())          # every registered codec, from the registry
    # one row per codec x budget x N x kind; sign is never compared, fixed-rate codecs at one budget only
    assert not df.duplicated(["kind", "codec", "budget", "workers"]).any()
    assert set(df.workers) == set(cv.WORKERS)
    assert df[df.codec == "sign"].status.str.startswith("n/a").all()
    for codec in ("terngrad", "fp16", "bf16", "fp32"):          # no "sweep" option: fixed rate
        assert df[(df.codec == codec) & (df.status == "ok")].groupby(["kind", "workers"]).size().eq(1).all()
    tg = df[(df.codec == "terngrad") & (df.status == "ok")]
    assert set(tg.budget) == {2.0} and set(df[(df.codec == "fp32") & (df.status == "ok")].budget) == {32.0}
    ok = df[df.status == "ok"]
    assert ok[["mse", "exact_mse", "rel_mse", "bits_per_element"]].notna().all().all()


def test_fp32_has_the_least_variance(variance):
    _, df = variance
    ok = df[df.status == "ok"]
    for (kind, N), g in ok.groupby(["kind", "workers"]):
        fp32 = float(g[g.codec == "fp32"].mse.iloc[0])
        others = g[g.codec != "fp32"]
        assert fp32 < others.mse.min(), (kind, N, fp32, others.loc[others.mse.idxmin(), ["codec", "budget", "mse"]])


def _z(df: pd.DataFrame, exact: pd.Series) -> np.ndarray:
    """(measured mean - exact) / se, se from the CSV's 95 % t-interval (mse_hi - mse = t_{0.975, R-1} se)."""
    se = (df.mse_hi - df.mse) / stats.t.ppf(0.975, df.R - 1)
    return ((df.mse - exact) / se).to_numpy()


def test_stochastic_codecs_measured_mse_matches_exact_formula(variance):
    """Every stochastic codec's measured MSE of the N-worker mean (terngrad at its default clipping,
    bias included; qsgd, suresh, randomk unbiased) is within its interval of the exact formula, at
    family-wise α = 0.05 (Bonferroni over the m distinct measurements, two-sided t, R - 1 degrees of
    freedom; seed 0); and the positive control: the same formula off by +10 % is outside it in every
    row."""
    _, df = variance
    rows = df[(df.status == "ok") & ~df.deterministic & (df.exact_mse > 0)]
    rows = rows.drop_duplicates(["kind", "codec", "knob", "workers"])     # a knob listed at several budgets
    assert set(rows.codec) == {"terngrad", "qsgd", "suresh", "randomk"}
    assert set(rows[rows.unbiased].codec) == {"qsgd", "suresh", "randomk"}
    m = len(rows)
    crit = stats.t.isf(ALPHA / (2 * m), rows.R - 1)
    z = _z(rows, rows.exact_mse)
    bad = rows[np.abs(z) > crit]
    assert bad.empty, bad[["kind", "codec", "budget", "workers", "mse", "exact_mse", "z"]]
    assert (np.abs(z) <= stats.t.isf(ALPHA / 2, rows.R - 1)).mean() >= 0.85      # plain 95 % intervals
    z_off = _z(rows, 1.1 * rows.exact_mse)
    assert (np.abs(z_off) > crit).all(), rows[np.abs(z_off) <= crit][["kind", "codec", "budget", "workers"]]


def test_bits_per_element_from_payload_within_budget(variance):
    _, df = variance
    ok = df[(df.status == "ok") & df.budget.isin(cv.BUDGETS)]
    over = ok[ok.bits_per_element > ok.budget * (1 + cv.TOL)]
    assert over.empty, over[["kind", "codec", "budget", "knob", "bits_per_element"]]
    # the knob search uses the budget: the searched codecs' best knobs take at least half of it
    searched = ok[ok.codec.isin(["qsgd", "topk", "randomk"])]
    assert (searched.bits_per_element >= 0.5 * searched.budget).all()


SPEEDUP_RUN_COLUMNS = ["sweep", "rule", "method", "codec_options", "lr", "knob", "knob_value", "workers", "seed",
                       "eps", "cap", "K", "status", "steps", "dist_final", "bits_up", "seconds", "compression"]


def test_speedup_writes_csvs_and_figure(speedup):
    out, t = speedup
    assert list(t["speedup_runs"].columns) == SPEEDUP_RUN_COLUMNS
    for col in ("workers", "K_gmean", "K_lo", "K_hi", "speedup", "efficiency", "local_slope", "compression"):
        assert col in t["speedup"].columns
    for col in ("method", "slope", "slope_lo", "slope_hi", "M_linear", "linear_slope", "not_reached"):
        assert col in t["speedup_fit"].columns
    assert set(t["speedup_fit"].method) <= set(common.quick_methods())
    assert (out / "speedup.png").stat().st_size > 10_000
    runs = t["speedup_runs"]
    w = runs[runs.sweep == "workers"]
    assert set(w.method) == {"fp32", "terngrad", "topk+ef"} and set(w.workers) == {1, 2, 4, 8}
    assert w.groupby(["rule", "method", "workers"]).seed.nunique().eq(3).all()
    assert set(w.rule) == set(cs.RULES) and set(runs[runs.sweep == "compression"].rule) == {"fp32-lr"}
    key, values = options.sweep(registry.codec_class("qsgd"))
    assert set(runs[runs.sweep == "compression"].knob_value) == {values[0], values[len(values) // 2]}
    fp32 = w[w.method == "fp32"]
    assert fp32.K.notna().all() and (fp32.bits_up == 32).all()
    assert ((runs.K.isna()) == ~runs.status.eq("reached")).all()


def test_fp32_speedup_slope_is_minus_one_in_the_noise_dominated_regime(speedup):
    """fp32's slope of log K on log M over M = 1..8 (3 seeds, seed intercepts) at its tuned γ0 (0.25 of
    the quick grid 0.25, 0.5): measured -1.09, 95 % interval (-1.19, -0.99) on the 2-core machine; tolerance |slope + 1| <= 0.2 and the interval
    excludes -0.5 (half the ideal speedup)."""
    _, t = speedup
    fits = t["speedup_fit"]
    fit = fits[fits.rule == "fp32-lr"].set_index("method").loc["fp32"]
    assert abs(fit.slope + 1) <= 0.2, fit.slope
    assert fit.slope_hi < -0.5, fit.slope_hi
    assert math.isfinite(fit.M_linear)


def test_speedup_learning_rate_rules_follow_the_validation_grid(speedup):
    """fp32-lr: every method's worker sweep at fp32's γ0 of least validation loss; own-lr: at its own;
    tuning runs use seed 100 on the validation split, at the compression sweep's M."""
    _, t = speedup
    grid, runs = t["speedup_lr_grid"], t["speedup_runs"]
    assert list(grid.columns) == cs.GRID_COLUMNS
    assert set(grid.lr) == {0.25, 0.5} and set(grid.seed) == {cs.TUNE_SEED} and set(grid.workers) == {4}
    assert np.isfinite(grid.val_loss).all() and (grid.status == "ok").all()
    fp_best = float(grid[grid.method == "fp32"].sort_values(["val_loss", "lr"]).lr.iloc[0])
    w = runs[runs.sweep == "workers"]
    assert (w[w.rule == "fp32-lr"].lr == fp_best).all()
    assert (runs[runs.sweep == "compression"].lr == fp_best).all()
    for method, g in grid.groupby("method"):
        best = float(g.sort_values(["val_loss", "lr"]).lr.iloc[0])
        assert g[g.chosen_own_lr].lr.tolist() == [best]
        assert (w[(w.rule == "own-lr") & (w.method == method)].lr == best).all()


# -- the registry is the one list of codecs ---------------------------------------------------------------

def test_variance_takes_codecs_and_knobs_from_the_registry():
    """Default codecs = registry.names(); knobs = the Options fields with "sweep" metadata that a label
    does not fix; unbiasedness = properties.unbiased; a majority-vote, stateful or multi-round codec
    is n/a."""
    assert cv.default_codecs() == registry.names()
    for name in registry.names():
        sp = cv.spec(name)
        assert sp.knobs == options.sweeps(registry.codec_class(name)), name
        assert sp.unbiased == registry.make(name).properties.unbiased
        props = registry.make(name).properties
        assert bool(sp.na) == (props.combine != "mean" or props.stateful or getattr(props, "rounds", 1) > 1)
    fixed = cv.spec("qsgd[levels=3;coding=elias]")
    assert fixed.fixed == {"levels": 3, "coding": "elias"} and set(fixed.knobs) == {"bucket"}
    assert cv.make_codec("qsgd[levels=3;coding=elias]", {"bucket": 128}).bucket == 128
    assert cv.spec("terngrad[clip=none]").unbiased and not cv.spec("terngrad").unbiased
    with pytest.raises(ValueError, match="has no option 'density'"):
        cv.spec("terngrad[density=0.5]")


def test_comparisons_default_to_every_registered_codec():
    methods = common.default_methods()
    assert methods[0] == common.baseline() == "fp32"
    assert [common.split_label(m)[0] for m in methods] == [common.baseline(), *(
        n for n in registry.names() if n != common.baseline())]
    assert {m for m in methods if m.endswith("+ef")} == {"scaled_sign+ef", "topk+ef"}
    sweeps = cs.default_sweeps(methods)
    assert sweeps["topk+ef"] == ("density", options.sweep(registry.codec_class("topk"))[1])
    assert sweeps["qsgd"][0] == "levels" and "terngrad" not in sweeps      # packing is not a number
    assert cs.default_sweeps(["qsgd[levels=3]"]) == {"qsgd[levels=3]": ("bucket", (0, 8192, 2048, 512, 128))}


def test_analysis_names_no_codec():
    """No string literal in analysis/ is a registered codec's name: the comparisons take the codecs from
    the registry, the TernGrad analyses name fp32 and TernGrad by their classes (docstrings aside)."""
    import ast
    import re
    from pathlib import Path

    root = Path(cv.__file__).parent
    names = set(registry.names())
    modules = sorted(root.glob("*.py"))
    assert len(modules) > 20 and root / "compare_variance.py" in modules
    for path in modules:
        mod = path.name
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        found = [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in docs
                 and isinstance(n.value, str) and names & set(re.split(r"[,+\[\]]", n.value))]
        assert not found, (mod, found)


def _options(text) -> dict:
    """The {key: value text} of a codec_options cell ("" or NaN: a codec without options)."""
    return dict(item.split("=", 1) for item in str(text).split(";")) if isinstance(text, str) and text else {}


def test_variance_rows_name_every_option_of_their_codec(variance):
    """Column codec_options: every option of the row's codec (defaults filled in), keys sorted; QSGD's
    rows name its coding (the default "paper" where no knob was chosen) and the chosen knob's values."""
    _, df = variance
    assert list(df.columns).index("codec_options") == list(df.columns).index("codec") + 1
    for codec, g in df.groupby("codec"):
        keys = sorted(options.keys(registry.codec_class(codec)))
        for text in g.codec_options:
            assert list(_options(text)) == keys, (codec, text)
    q = df[df.codec == "qsgd"]
    assert not q.empty and q.codec_options.str.contains("coding=").all()
    for r in q.itertuples():
        got = _options(r.codec_options)
        knob = dict(item.split("=", 1) for item in r.knob.split(", ")) if r.status == "ok" else {}
        want = {**{k: str(v) for k, v in options.resolved(registry.codec_class("qsgd")).items()}, **knob}
        assert got == want, (r.codec_options, r.knob)
    assert _options(common.codec_options("qsgd"))["coding"] == "paper"


def test_speedup_rows_name_their_codec_options(speedup):
    """Every CSV of compare speedup has codec_options after method: the method's codec at its options,
    and in the compression sweep at the row's knob value."""
    _, t = speedup
    for name, df in t.items():
        cols = list(df.columns)
        assert cols.index("codec_options") == cols.index("method") + 1, name
    runs = t["speedup_runs"]
    for r in runs.itertuples():
        if r.sweep == "compression":
            want = common.codec_options(r.method, {r.knob: int(r.knob_value)})
            assert _options(r.codec_options)[r.knob] == str(int(r.knob_value))
        else:
            want = common.codec_options(r.method)
        assert (r.codec_options if isinstance(r.codec_options, str) else "") == want, r
