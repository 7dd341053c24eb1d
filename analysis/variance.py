"""`tgsim analyze variance`: empirical E||Q(g)-g||^2 and E||Q(g)||^2 against exact formulas and bounds.

For every gradient shape (synthetic and recorded per-layer MLP gradients, or with ``model`` those of a
torch.nn.Module factory, named 'model:<parameter name>') and every quantizer:

* TernGrad through the real codec (encode -> decode, ``unbiasedness.codec_draws``) with clip none,
  explicit and implicit; formulas from ``tgsim.analysis.common.terngrad_error`` /
  ``terngrad_second_moment`` (= s||g||_1 - ||g||^2 and s||g||_1 without clipping; with clipping
  the error includes the clipping bias);
* the peers of docs/THEORY.md §2 (``tgsim.analysis.peers``): QSGD with several s, scaled sign, random
  sparsification with variance-optimal p, top-k, stochastic binary.

``variance.csv``: one row per (shape, quantizer, quantity in {error, second_moment}) with the
empirical mean over R draws, its standard error, the exact formula and the CLT test
(``unbiasedness.mse_interval_test``, two-sided, level alpha). Deterministic quantizers (scaled sign,
top-k) are compared exactly (relative tolerance 1e-9) instead.

``variance_bounds.csv``: one row per (shape, quantizer, published bound): the bound, the exact
value, ``exact_over_bound`` and the one-sided CLT test "E > bound" at level alpha
(``exceeded``: the empirical mean is significantly above the bound). The QSGD printed
second-moment bound min(n/s^2, sqrt(n)/s)||g||^2 is exceeded whenever min(...) < 1 (the corrected
bound is (1 + min(...))||g||^2, docs/THEORY.md §2 note).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats as _st

from tgsim.analysis import peers
from tgsim.analysis import unbiasedness as ub
from tgsim.analysis.common import gradient_shapes, terngrad_error, terngrad_second_moment
from tgsim.codecs import TernGrad
from tgsim.codecs.qsgd import QSGD

QSGD_LEVELS = (1, 4, 64)
PEER_NAMES = tuple(n for n in peers.PEERS if n != TernGrad.name)   # TernGrad itself runs through the codec
LEVELS_SWEPT = QSGD.name            # the peer drawn at each of QSGD_LEVELS


def _empirical_rows(base: dict, err: np.ndarray, sq: np.ndarray, f_err: float, f_sq: float,
                    alpha: float, deterministic: bool) -> list[dict]:
    rows = []
    for quantity, x, f in (("error", err, f_err), ("second_moment", sq, f_sq)):
        if deterministic:
            m = float(np.mean(x))
            ok = math.isclose(m, f, rel_tol=1e-9, abs_tol=1e-30)
            rows.append(dict(base, quantity=quantity, R=x.size, test="deterministic (exact)", alpha=alpha,
                             empirical=m, se=0.0, formula=f, z=0.0 if ok else float("inf"),
                             pvalue=1.0 if ok else 0.0, reject=not ok))
        elif math.isclose(float(np.mean(x)), f, rel_tol=1e-9, abs_tol=1e-30):
            # equal to rounding (e.g. sparsification keeping every non-zero with p = 1): the per-draw
            # values differ only in the last bits and a CLT z would be meaningless
            rows.append(dict(base, quantity=quantity, R=x.size, test="equal to rounding", alpha=alpha,
                             empirical=float(np.mean(x)), se=float(np.std(x) / math.sqrt(x.size)),
                             formula=f, z=0.0, pvalue=1.0, reject=False))
        else:
            r = ub.mse_interval_test(x, f, alpha)
            rows.append(dict(base, quantity=quantity, R=r.R, test=r.test, alpha=alpha, empirical=r.mean,
                             se=r.se, formula=f, z=r.z, pvalue=r.pvalue, reject=r.reject))
    return rows


def _bound_rows(base: dict, bounds: dict, err: np.ndarray, sq: np.ndarray, f_err: float, f_sq: float,
                alpha: float) -> list[dict]:
    rows = []
    zc = float(_st.norm.isf(alpha))
    for bname, (quantity, value) in bounds.items():
        x, f = (err, f_err) if quantity == "error" else (sq, f_sq)
        m = float(np.mean(x))
        se = float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
        z = (m - value) / se if se > 0 else (float("inf") if m > value * (1 + 1e-12) else float("-inf"))
        rows.append(dict(base, bound=bname, quantity=quantity, bound_value=value, exact=f,
                         exact_over_bound=f / value if value > 0 else float("nan"), empirical=m, se=se,
                         z_above=z, alpha=alpha, exceeded=bool(z > zc)))
    return rows


def variance_table(shapes: dict[str, np.ndarray], R: int = 1000, alpha: float = 1e-3, seed: int = 0,
                   clips=("none", "explicit", "implicit"), peer_names=PEER_NAMES,
                   qsgd_levels=QSGD_LEVELS, density: float = 0.1, formulas=None):
    """(variance, bounds) DataFrames; see the module docstring.

    formulas: optional {quantizer label: f(g) -> (error, second_moment)} overriding the exact
    formulas (the positive controls plug a wrong formula in here).
    """
    formulas = formulas or {}
    rows, brows = [], []
    for si, (name, g) in enumerate(shapes.items()):
        g32 = np.asarray(g, dtype=np.float32).reshape(-1)
        v = g32.astype(np.float64)
        n = v.size
        nv2 = float(v @ v)
        # --- TernGrad through the codec
        for ci, clip in enumerate(clips):
            label = f"{TernGrad.name}[{clip}]"
            d = ub.codec_draws(TernGrad(clip=clip), g32, R, seed=seed + 100 * si + ci)
            f_err, f_sq = (float(terngrad_error(g32, clip)[0]), float(terngrad_second_moment(g32, clip)[0]))
            if label in formulas:
                f_err, f_sq = formulas[label](g32)
            base = dict(shape=name, n=n, quantizer=label, levels=np.nan, norm2=nv2,
                        bits_per_element=peers.bits_per_element(TernGrad.name, n))
            rows += _empirical_rows(base, d.sq_error, d.sq_norm, f_err, f_sq, alpha, False)
            if clip == "none":
                brows += _bound_rows(base, peers.bounds(TernGrad.name, v), d.sq_error, d.sq_norm, f_err, f_sq, alpha)
        # --- peers (pure functions)
        rng = np.random.default_rng([seed, si, 7])
        k = max(1, int(round(density * n)))
        for pname in peer_names:
            for s in (qsgd_levels if pname == LEVELS_SWEPT else (None,)):
                kw = dict(s=s or 4, k=k)
                label = f"{pname}[s={s}]" if pname == LEVELS_SWEPT else pname
                q = peers.draw(pname, v, rng, 1 if peers.is_deterministic(pname) else R, **kw)
                diff = q - v
                err = np.einsum("ij,ij->i", diff, diff)
                sq = np.einsum("ij,ij->i", q, q)
                f_err, f_sq = peers.exact_error(pname, v, **kw), peers.exact_second_moment(pname, v, **kw)
                if label in formulas:
                    f_err, f_sq = formulas[label](v)
                base = dict(shape=name, n=n, quantizer=label, levels=s if s else np.nan, norm2=nv2,
                            bits_per_element=peers.bits_per_element(pname, n, **kw))
                rows += _empirical_rows(base, err, sq, f_err, f_sq, alpha, peers.is_deterministic(pname))
                brows += _bound_rows(base, peers.bounds(pname, v, **kw), err, sq, f_err, f_sq, alpha)
    var = pd.DataFrame(rows)
    var["formula_over_norm2"] = var["formula"] / var["norm2"]
    return var, pd.DataFrame(brows)


def run(out=None, *, n: int = 3000, R: int = 1000, alpha: float = 1e-3, seed: int = 0,
        recorded_steps: int | None = 50, quiet: bool = False, model: str | None = None,
        data: str = "digits") -> dict[str, pd.DataFrame]:
    """Write variance and variance_bounds to `out`: the synthetic shapes and the per-layer gradients of
    tgsim's MLP, or of the torch factory `model`, on `data`."""
    from tgsim.analysis.common import single_thread, write_csv

    with single_thread():
        shapes = gradient_shapes(n, seed, recorded_steps, model=model, data=data)
        var, bnd = variance_table(shapes, R, alpha, seed)
    write_csv(var, out, "variance")
    write_csv(bnd, out, "variance_bounds")
    if not quiet:
        print(f"CLT test of E||Q-g||^2 and E||Q||^2 against the exact formulas, alpha = {alpha}, R = {R}:")
        print(f"  {int(var['reject'].sum())} of {len(var)} rejected")
        if var["reject"].any():
            print(var.loc[var["reject"], ["shape", "quantizer", "quantity", "empirical", "formula", "z"]]
                  .to_string(index=False))
        e = var[var["quantity"] == "error"].pivot(index="shape", columns="quantizer", values="formula_over_norm2")
        print("\nexact E||Q(g)-g||^2 / ||g||^2 (bits/element: terngrad 2, qsgd 1+ceil(log2(s+1)), "
              "sparsification/top-k 10 % density):")
        print(e.round(3).to_string())
        print("\npublished bounds: exact/bound (>1 = bound violated), and 'exceeded' (one-sided CLT):")
        b = bnd.groupby(["quantizer", "bound"]).agg(max_exact_over_bound=("exact_over_bound", "max"),
                                                    exceeded_in=("exceeded", "sum"), cases=("exceeded", "size"))
        print(b.round(3).to_string())
    return {"variance": var, "variance_bounds": bnd}
