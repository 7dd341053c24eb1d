"""Subcommands of `tgsim analyze` for the theorem's assumptions, unbiasedness, variance, convergence.

    tgsim analyze unbiasedness | variance | bound | assumption1 | convergence | clipping | sharing
                  [--out DIR] [--seed S] [check options]

Each runs on built-in defaults (under 2 minutes on 2 cores), writes tidy CSVs to --out (default
results/analysis/) and prints a short summary. Heavy imports happen only when a check runs.
"""

from __future__ import annotations

import argparse
import importlib
import time

DEFAULT_OUT = "results/analysis"   # = tgsim.analysis.common.DEFAULT_OUT (not imported: keeps --help light)


def _runner(module: str, kwargs_from_args):
    def func(args) -> int:
        mod = importlib.import_module(f"tgsim.analysis.{module}")
        t0 = time.perf_counter()
        frames = mod.run(args.out, **kwargs_from_args(args))
        print(f"\nwrote {', '.join(f'{k}.csv' for k in frames)} to {args.out}/ "
              f"({time.perf_counter() - t0:.1f} s)")
        return 0
    return func


def register(sub) -> None:
    """Add the seven checks to the `tgsim analyze` sub-parser action `sub`."""

    def add(name, help_, module, kwargs_from_args, extra=()):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--out", default=str(DEFAULT_OUT), help="directory for the CSVs (default %(default)s)")
        for args, kw in extra:
            p.add_argument(*args, **kw)
        p.set_defaults(func=_runner(module, kwargs_from_args))

    add("unbiasedness", "exact binomial test of TernGrad (none/explicit/implicit clip) over gradient shapes, "
        "and its power against a multiplicative bias", "unbiased_check",
        lambda a: dict(n=a.n, R=a.R, alpha=a.alpha, seed=a.seed),
        [(("--n",), dict(type=int, default=3000, help="synthetic vector size")),
         (("--R",), dict(type=int, default=2000, help="codec draws per vector")),
         (("--alpha",), dict(type=float, default=1e-3, help="family-wise level")),
         (("--seed",), dict(type=int, default=0))])
    add("variance", "E||Q(g)-g||^2 and E||Q(g)||^2 of TernGrad and its peers vs exact formulas and published "
        "bounds", "variance",
        lambda a: dict(n=a.n, R=a.R, alpha=a.alpha, seed=a.seed),
        [(("--n",), dict(type=int, default=3000)), (("--R",), dict(type=int, default=1000)),
         (("--alpha",), dict(type=float, default=1e-3)), (("--seed",), dict(type=int, default=0))])
    add("bound", "Assumption 3: envelopes A + B||w-w*||^2 of ||g||^2 and E||Q(g)||^2 along least-squares "
        "trajectories; per-layer ratios of an MLP", "bound",
        lambda a: dict(seeds=tuple(range(a.seeds)), steps=a.steps, mlp_steps=a.mlp_steps),
        [(("--seeds",), dict(type=int, default=4)), (("--steps",), dict(type=int, default=800)),
         (("--mlp-steps",), dict(type=int, default=300))])
    add("assumption1", "sign of (w-w*)^T grad C(w) along trajectories; non-convex control", "assumption1",
        lambda a: dict(seeds=tuple(range(a.seeds)), steps=a.steps),
        [(("--seeds",), dict(type=int, default=3)), (("--steps",), dict(type=int, default=400))])
    add("convergence", "Robbins-Monro vs constant steps on noisy least squares: decay exponent, floors vs "
        "the quantizer's variance at w*", "convergence",
        lambda a: dict(seeds=a.seeds, floor_seeds=a.floor_seeds, steps=a.steps, lr=a.lr, tau=a.tau),
        [(("--seeds",), dict(type=int, default=20)), (("--floor-seeds",), dict(type=int, default=4)),
         (("--steps",), dict(type=int, default=2000)), (("--lr",), dict(type=float, default=0.5)),
         (("--tau",), dict(type=float, default=50.0))])
    add("clipping", "per-layer clipping statistics over MLP training: fraction clipped, length, angle, bias",
        "clipping", lambda a: dict(seed=a.seed, steps=a.steps, every=a.every),
        [(("--seed",), dict(type=int, default=0)), (("--steps",), dict(type=int, default=300)),
         (("--every",), dict(type=int, default=5))])
    add("sharing", "variance added by scaler sharing, iid vs Dirichlet shards, 8 workers", "sharing",
        lambda a: dict(seed=a.seed, R=a.R),
        [(("--seed",), dict(type=int, default=0)), (("--R",), dict(type=int, default=200))])


def main(argv=None) -> int:  # pragma: no cover - convenience: python -m tgsim.analysis.checks_cli
    p = argparse.ArgumentParser(prog="tgsim analyze")
    sub = p.add_subparsers(dest="check", required=True)
    register(sub)
    args = p.parse_args(argv)
    return args.func(args)
