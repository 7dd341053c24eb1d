"""`tgsim analyze sharing`: the variance added by scaler sharing when workers' gradients differ.

With scaler sharing every worker ternarizes layer l with s = max_i s_i (docs/THEORY.md §1). Each message
stays unbiased; worker i's variance becomes s ||g_i||_1 - ||g_i||^2 instead of
s_i ||g_i||_1 - ||g_i||^2 (s_i = ||g_i||_inf its own scaler).

Setup: an MLP on digits trained briefly with fp32 (iid, 8 workers); at parameter snapshots along
that run, the 8 workers' mini-batch gradients are taken from shards of four kinds: iid and
label-skewed Dirichlet shards with alpha = 0.1, 1, 100 (``tgsim.data.shard``, every worker keeps at
least one batch), for per-worker batches of 16 and 64 (the larger the batch, the less the workers'
maxima differ by sampling alone, and the more the label skew shows). For every (scheme, snapshot, batch, layer, worker):

* ``measured``: mean of ||Q_i(g_i) - g_i||^2 over R draws of the real codec with the shared scaler
  (``unbiasedness.codec_draws(..., shared_scaler=s)``), CLT test against ``formula_shared`` =
  s||g_i||_1 - ||g_i||^2 (two-sided; ``reject`` at alpha / number of tests, Bonferroni);
* the mean mode (`[codec] sharing = "mean"`): s_mean = f32(Σ_i f64(s_i) / N), every worker clips
  at it, x = min(|g_i|, s_mean): variance s_mean ||x||_1 - ||x||^2 plus the squared bias
  ||x - |g_i|||^2 (``formula_mean``), tested against the codec like the MAX formula; per (scheme,
  layer) the averaged gradient's E||mean_i Q_i - mean_i g_i||^2 = (1/N^2) Σ_i var_i + ||mean_i
  bias_i||^2 of the mean mode over the MAX's (``mean_over_max``) and over own scalers'
  (``mean_over_own``), and the bias's share of it (``mean_bias_share``);
* ``ratio`` = formula_shared / formula_own (over `batches` mini-batches per snapshot; the codec
  draws only on the first `draw_batches` of the first snapshot), and per (scheme, layer) ``aggregate_ratio`` =
  Σ_i formula_shared / Σ_i formula_own (the variance of the averaged gradient, shared / unshared).

The label skew of each scheme is reported as the mean total-variation distance of the workers'
label distributions from the global one (``tgsim.data.tv_distances``).
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from tgsim.analysis import unbiasedness as ub
from tgsim.analysis.common import mlp_digits_config, single_thread, trajectory, write_csv
from tgsim.codecs import TernGrad
from tgsim.exchange.base import mean_of_scalers

SCHEMES = (("iid", None), ("dirichlet", 0.1), ("dirichlet", 1.0), ("dirichlet", 100.0))


@functools.lru_cache(maxsize=4)
def snapshots(seed: int = 0, at=(0, 200), workers: int = 8, batch: int = 16, **kw):
    """({step: params}, setup) of an fp32 MLP-on-digits run at the given steps (cached)."""
    cfg = mlp_digits_config(seed, steps=max(at) + 1, workers=workers, batch=batch, **kw)
    snaps = {}

    def rec(t, setup, params, grads):
        if t in at:
            snaps[t] = {k: v.copy() for k, v in params.items()}

    setup, _ = trajectory(cfg, max(at) + 1, rec, need_grads=False)
    return snaps, setup


def sharing_table(seed: int = 0, at=(0, 200), schemes=SCHEMES, workers: int = 8, batch: int = 16,
                  batches: int = 8, draw_batches: int = 1, R: int = 200, alpha: float = 1e-3,
                  formula=None, formula_mean=None) -> pd.DataFrame:
    """One row per (scheme, snapshot, batch, layer, worker); see module docstring.

    The formulas (and ratios) use `batches` mini-batches per snapshot; the codec is drawn R times
    (CLT test) on the first `draw_batches` of them at the first snapshot (``measured`` is NaN on
    the others).
    formula(g, s_shared, s_own) -> claimed E||Q(g)-g||^2 overrides the formula (positive controls);
    formula_mean(g, s_mean, s_shared) the mean mode's.
    """
    from tgsim.data import batch_indices, shard, tv_distances

    snaps, setup = snapshots(seed, tuple(at), workers)
    ds, model = setup.dataset, setup.model
    codec = TernGrad(clip="none")
    codec_mean = TernGrad(clip="none", sharing="mean")
    rows = []
    for scheme, a in schemes:
        shards = shard(ds.y_train, workers, scheme, alpha=a if a else 0.5, seed=seed, min_per_worker=batch)
        tv = float(np.mean(tv_distances(ds.y_train, shards, ds.n_classes)))
        label = scheme if a is None else f"dirichlet({a:g})"
        for t, params in snaps.items():
            for b in range(batches):
                idx = np.stack([batch_indices(shards[w], batch, seed, 10_000 + b, w) for w in range(workers)])
                _, grads = model.loss_and_grad(params, ds.x_train[idx], ds.y_train[idx])
                for li, (name, g) in enumerate(grads.items()):
                    g = g.reshape(workers, -1)
                    a_ = np.abs(g.astype(np.float64))
                    s_own = a_.max(axis=1)
                    s_sh = np.float32(s_own.max())
                    s_mean = mean_of_scalers(s_own.astype(np.float32)[:, None], workers)[0]
                    x_mean = np.minimum(a_, float(s_mean))        # every worker clips at the mean scaler
                    bias_mean = np.sign(g) * (x_mean - a_)        # E[Q_i] - g_i per element
                    agg_bias_sq = float(np.sum(bias_mean.mean(axis=0) ** 2))
                    for w in range(workers):
                        l1, l2 = float(a_[w].sum()), float(a_[w] @ a_[w])
                        f_sh = float(s_sh) * l1 - l2
                        f_own = float(s_own[w]) * l1 - l2
                        var_mean = float(s_mean) * float(x_mean[w].sum()) - float(x_mean[w] @ x_mean[w])
                        b_sq = float(bias_mean[w] @ bias_mean[w])
                        claim = f_sh if formula is None else float(formula(g[w], float(s_sh), float(s_own[w])))
                        row = dict(scheme=label, mean_tv=tv, snapshot_step=t, batch=b, layer=name,
                                   n=g.shape[1], worker=w, s_own=float(s_own[w]), s_shared=float(s_sh),
                                   formula_own=f_own, formula_shared=f_sh, claimed=claim,
                                   ratio=f_sh / f_own if f_own > 0 else np.nan, R=0, measured=np.nan,
                                   se=np.nan, z=np.nan, pvalue=np.nan,
                                   s_mean=float(s_mean), var_mean=var_mean, bias_sq_mean=b_sq,
                                   formula_mean=var_mean + b_sq, aggregate_bias_sq_mean=agg_bias_sq,
                                   R_mean=0, measured_mean=np.nan, pvalue_mean=np.nan)
                        if b < draw_batches and t == min(snaps):
                            d = ub.codec_draws(codec, g[w], R, seed=seed + 7919 * b, worker=w,
                                               shared_scaler=s_sh, name=name)
                            r = ub.mse_interval_test(d.sq_error, claim, alpha)
                            row.update(R=R, measured=r.mean, se=r.se, z=r.z, pvalue=r.pvalue)
                            d = ub.codec_draws(codec_mean, g[w], R, seed=seed + 7919 * b + 1, worker=w,
                                               shared_scaler=s_mean, name=name)
                            claim_mean = var_mean + b_sq if formula_mean is None else \
                                float(formula_mean(g[w], float(s_mean), float(s_sh)))
                            r = ub.mse_interval_test(d.sq_error, claim_mean, alpha)
                            row.update(R_mean=R, measured_mean=r.mean, pvalue_mean=r.pvalue)
                        rows.append(row)
    df = pd.DataFrame(rows)
    df["alpha"] = alpha
    tested = df["pvalue"].notna() | df["pvalue_mean"].notna()
    k = max(int(df["pvalue"].notna().sum() + df["pvalue_mean"].notna().sum()), 1)     # Bonferroni over both
    df["reject"] = tested & ((df["pvalue"] < alpha / k) | (df["pvalue_mean"] < alpha / k))
    return df


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    if "per_worker_batch" in df:
        return pd.concat([summarize(d.drop(columns="per_worker_batch")).assign(per_worker_batch=b)
                          for b, d in df.groupby("per_worker_batch", sort=False)], ignore_index=True)
    g = df.groupby(["scheme", "layer"], sort=False)
    out = g.agg(mean_tv=("mean_tv", "first"), n=("n", "first"), tests=("pvalue", "count"), rejected=("reject", "sum"),
                median_ratio=("ratio", "median"), mean_ratio=("ratio", "mean"), max_ratio=("ratio", "max"),
                median_s_shared_over_own=("s_shared", lambda v: float(np.median(v / df.loc[v.index, "s_own"]))))
    agg = g.apply(lambda x: x["formula_shared"].sum() / x["formula_own"].sum(), include_groups=False)
    out["aggregate_ratio"] = agg
    # E||mean_i Q_i - mean_i g_i||^2 = (1/N^2) Σ_i var_i + ||mean_i bias_i||^2, summed over the
    # (snapshot, batch) cases; mean mode against MAX and against own scalers
    def _agg_mse(x):
        per = x.groupby(["snapshot_step", "batch"], sort=False)
        n2 = x["worker"].nunique() ** 2
        mean_mse = (per["var_mean"].sum() / n2 + per["aggregate_bias_sq_mean"].first()).sum()
        return pd.Series({"mean_over_max": mean_mse / (per["formula_shared"].sum() / n2).sum(),
                          "mean_over_own": mean_mse / (per["formula_own"].sum() / n2).sum(),
                          "mean_bias_share": (per["aggregate_bias_sq_mean"].first()).sum() / mean_mse})
    out = out.join(g.apply(_agg_mse, include_groups=False))
    model = (df.groupby(["scheme", "snapshot_step", "batch", "worker"], sort=False)[["formula_shared", "formula_own"]].sum()
             .groupby("scheme", sort=False).sum())
    out = out.reset_index()
    tot = pd.DataFrame({"scheme": model.index, "layer": "model", "aggregate_ratio":
                        (model["formula_shared"] / model["formula_own"]).to_numpy()})
    tot["mean_tv"] = tot["scheme"].map(df.groupby("scheme")["mean_tv"].first())
    return pd.concat([out, tot], ignore_index=True)


def run(out=None, *, seed: int = 0, R: int = 200, batches: int = 8, draw_batches: int = 1, at=(0, 200),
        batch_sizes=(16, 64), alpha: float = 1e-3, quiet: bool = False) -> dict[str, pd.DataFrame]:
    with single_thread():
        df = pd.concat([sharing_table(seed, at, batch=b, R=R, batches=batches, draw_batches=draw_batches,
                                      alpha=alpha).assign(per_worker_batch=b) for b in batch_sizes],
                       ignore_index=True)
    summ = summarize(df)
    write_csv(df, out, "sharing")
    write_csv(summ, out, "sharing_summary")
    if not quiet:
        print(f"scaler sharing, 8 workers, MLP on digits: E||Q_i(g_i)-g_i||^2 with s = max_i s_i, R = {R} draws, "
              f"CLT test vs s||g_i||_1 - ||g_i||^2: {int(df['reject'].sum())} of {int(df['pvalue'].notna().sum())} "
              f"rejected (alpha = {alpha}, Bonferroni per batch size)")
        cols = ["per_worker_batch", "scheme", "layer", "mean_tv", "median_ratio", "mean_ratio", "max_ratio",
                "median_s_shared_over_own", "aggregate_ratio", "mean_over_max", "mean_over_own", "mean_bias_share",
                "tests", "rejected"]
        print(summ[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return {"sharing": df, "sharing_summary": summ}
