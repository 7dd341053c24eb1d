"""`tgsim analyze clipping`: what c·σ clipping does to each layer's gradient over training.

MLP on digits trained with TernGrad (explicit clipping, c = 2.5, the paper's setting; 4 workers), or
a torch.nn.Module built by the factory ``model`` = "package.module:function" on the data set ``data``
(``common.network_section``; its layers are the module's parameter names).
Before every `every`-th step, for each worker's gradient g of each layer, with b = c·σ(g) (the
codec's bound, ``common.terngrad_scaling``) and g_c = sign(g) min(|g|, b) = E[Q(g)]:

    fraction_clipped   mean(|g_k| > b)
    length_change      ||g_c|| / ||g|| - 1                     (negative: shorter)
    angle_deg          angle between g_c and g, in degrees
    bias_rel           ||g_c - g|| / ||g||                     (the bias E[Q(g)] - g, relative)
    bias_share         ||g_c - g||^2 / E||Q_explicit(g) - g||^2 (part of the error that is bias)
    error_ratio_explicit, error_ratio_implicit
                       E||Q(g) - g||^2 with clipping / without (< 1: clipping lowers the total error)

Explicit and implicit clipping have the same E[Q(g)] (the bound c·σ; implicit uses s = c·σ and
saturates |g_k| >= s), hence the same bias; they differ in variance (implicit keeps s = c·σ even when
max|g| < c·σ). ``gaussian_reference`` gives the same numbers for an i.i.d. Gaussian vector (docs/THEORY.md
§1: 1.24 % clipped, length -1.1 %, angle 2.75°).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tgsim.analysis.common import (TERNGRAD, mlp_digits_config, network_label, single_thread, terngrad_error,
                                   terngrad_scaling, trajectory, write_csv)


def clip_stats(g, clip_factor: float = 2.5) -> dict[str, np.ndarray]:
    """Per-row statistics (rows = workers) of explicit c·σ clipping of g; see module docstring."""
    g = np.asarray(g, dtype=np.float32)
    g = g.reshape(1, -1) if g.ndim == 1 else g.reshape(g.shape[0], -1)
    a64 = g.astype(np.float64)
    _, bound = terngrad_scaling(g, "explicit", clip_factor)
    gc = np.sign(a64) * np.minimum(np.abs(a64), bound[:, None])
    n_g = np.linalg.norm(a64, axis=1)
    n_c = np.linalg.norm(gc, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.clip(np.einsum("ij,ij->i", gc, a64) / (n_g * n_c), -1.0, 1.0)
        bias2 = np.sum((gc - a64) ** 2, axis=1)
        e_none = terngrad_error(g, "none")
        e_exp = terngrad_error(g, "explicit", clip_factor)
        e_imp = terngrad_error(g, "implicit", clip_factor)
        return dict(fraction_clipped=np.mean(np.abs(a64) > bound[:, None], axis=1),
                    length_change=n_c / n_g - 1.0, angle_deg=np.degrees(np.arccos(cos)),
                    bias_rel=np.sqrt(bias2) / n_g, bias_share=bias2 / e_exp,
                    error_ratio_explicit=e_exp / e_none, error_ratio_implicit=e_imp / e_none)


def gaussian_reference(n: int = 1_000_000, seed: int = 0, clip_factor: float = 2.5) -> dict:
    g = np.random.default_rng([seed, 0xC11]).standard_normal(n).astype(np.float32)
    return {k: float(v[0]) for k, v in clip_stats(g, clip_factor).items()}


def mlp_clipping(seed: int = 0, steps: int = 300, every: int = 5, clip_factor: float = 2.5,
                 **kw) -> pd.DataFrame:
    """Rows per (step, layer, worker) along TernGrad (explicit clipping) training of an MLP on digits, or
    of the network `kw` names (``mlp_digits_config``'s model and data)."""
    cfg = mlp_digits_config(seed, codec=TERNGRAD, clip="explicit", steps=steps, **kw)
    rows = []

    def rec(t, setup, params, grads):
        if t % every:
            return
        for name, g in grads.items():
            st = clip_stats(g, clip_factor)
            n_el = int(np.prod(g.shape[1:]))
            for i in range(g.shape[0]):
                rows.append(dict(step=t, layer=name, n=n_el, worker=i, **{k: float(v[i]) for k, v in st.items()}))

    trajectory(cfg, steps, rec)
    return pd.DataFrame(rows)


STATS = ("fraction_clipped", "length_change", "angle_deg", "bias_rel", "bias_share",
         "error_ratio_explicit", "error_ratio_implicit")


def summarize(df: pd.DataFrame, steps: int) -> pd.DataFrame:
    d = df.assign(phase=np.where(df["step"] < steps / 2, "first half", "second half"))
    agg = {k: (k, "mean") for k in STATS}
    out = d.groupby(["layer", "phase"], sort=False).agg(n=("n", "first"), **agg).reset_index()
    whole = df.groupby("layer", sort=False).agg(n=("n", "first"), **agg).reset_index().assign(phase="all")
    return pd.concat([whole, out], ignore_index=True)


def run(out=None, *, seed: int = 0, steps: int = 300, every: int = 5, clip_factor: float = 2.5,
        quiet: bool = False, model: str | None = None, data: str = "digits") -> dict[str, pd.DataFrame]:
    """Write clipping (per step, layer, worker) and clipping_summary to `out`: the network is tgsim's
    MLP, or the torch factory `model`, trained on `data`."""
    with single_thread():
        df = mlp_clipping(seed, steps, every, clip_factor, model=model, data=data)
    summ = summarize(df, steps)
    ref = gaussian_reference(clip_factor=clip_factor)
    summ = pd.concat([summ, pd.DataFrame([dict(layer="gaussian reference", n=1_000_000, phase="-", **ref)])],
                     ignore_index=True)
    write_csv(df, out, "clipping")
    write_csv(summ, out, "clipping_summary")
    if not quiet:
        print(f"explicit c·σ clipping (c = {clip_factor}), {network_label(model, data)} trained with TernGrad, "
              f"mean over steps "
              f"and 4 workers (length_change, bias_rel: fractions; angle in degrees):")
        print(summ.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return {"clipping": df, "clipping_summary": summ}
