"""Subcommands of `tgsim analyze` for the theorem's assumptions, unbiasedness, variance, convergence.

    tgsim analyze unbiasedness | variance | bound | assumption1 | convergence | clipping | sharing
                  [--out DIR] [--quick] [--seed S] [check options]

Each runs on built-in defaults, writes tidy CSVs to --out (default results/analysis/) and prints a
short summary. --quick runs the same code on small parameters; an option given on the command line
wins over its --quick value. Heavy imports happen only when a check runs.

The checks that train a network (unbiasedness' and variance's recorded gradients, bound's per-layer
part, clipping) take --model package.module:function, a torch.nn.Module factory measured instead of
tgsim's MLP (its layers: the module's parameter names; built by tgsim.models.make_model, torch
imported there), and --data, the data set it trains on (default digits): one of tgsim's data sets by
name, or your own torch data as its factory "package.module:function" (a config's [data] name =
"torch", options = {factory = ...}: tgsim.torch.data).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tgsim.errors import ConfigError

DEFAULT_OUT = "results/analysis"   # = tgsim.analysis.common.DEFAULT_OUT (not imported: keeps --help light)


@dataclass(frozen=True)
class Opt:
    """One option of a check: its flag, type, full default and --quick value."""

    flag: str
    type: Callable[[str], Any]
    full: Any
    quick: Any
    help: str = ""

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Check:
    """One `tgsim analyze` check: `tgsim.analysis.<module>.run(out, **kwargs(args))`.

    quick_run: keyword arguments of `run` that have no option and that --quick alone sets."""

    name: str
    help: str
    module: str
    kwargs: Callable[[argparse.Namespace], dict]
    options: tuple[Opt, ...]
    quick_run: dict = field(default_factory=dict)


def _seed() -> Opt:
    return Opt("--seed", int, 0, 0, "random seed")


def factory_spec(text: str) -> str:
    """`text` if it looks like "package.module:function", else argparse's error saying so."""
    if text and (text.count(":") != 1 or not all(text.split(":"))):
        raise argparse.ArgumentTypeError(f"expected 'package.module:function', got {text!r}")
    return text


def data_name(text: str) -> str:
    """`text` if it names one of tgsim's data sets (tgsim.data.DATASETS) or is a torch data factory
    "package.module:function" (tgsim.torch.data), else argparse's error saying what is valid."""
    from tgsim.data.datasets import DATASETS

    if text and ":" in text:
        return factory_spec(text)
    if text == "torch":
        raise argparse.ArgumentTypeError("data 'torch' needs its factory: --data package.module:function")
    if text and text not in DATASETS:
        raise argparse.ArgumentTypeError(f"unknown data set {text!r}; valid: "
                                         f"{', '.join(d for d in DATASETS if d != 'torch')}, or a torch data "
                                         "factory 'package.module:function'")
    return text


NETWORK_OPTIONS = (
    Opt("--model", factory_spec, "", "", "a torch.nn.Module factory 'package.module:function' to measure "
        "instead of tgsim's MLP (needs the torch extra)"),
    Opt("--data", data_name, "", "", "the data set the network trains on: a name of tgsim.data.DATASETS, or a "
        "torch data factory 'package.module:function' (as [data] options = {factory = ...}); empty: digits"))


def network(a: argparse.Namespace) -> dict:
    """The `run` keyword arguments model and data, each only where given (an empty value: the default)."""
    return {k: v for k, v in (("model", a.model), ("data", a.data)) if v}


CHECKS = (
    Check("unbiasedness", "exact binomial test of TernGrad (none/explicit/implicit clip) over gradient shapes, "
          "and its power against a multiplicative bias", "unbiased_check",
          lambda a: dict(n=a.n, R=a.R, alpha=a.alpha, seed=a.seed, codec=a.codec, **network(a)),
          (Opt("--n", int, 3000, 300, "synthetic vector size"), Opt("--R", int, 2000, 200, "codec draws per vector"),
           Opt("--alpha", float, 1e-3, 1e-3, "family-wise level"), _seed(),
           Opt("--codec", str, "", "", "a registered codec, NAME[key=value] with options, NAME+ef with error "
               "feedback, or 'all' (every codec, "
               "with and without error feedback): the test of each codec's declared unbiasedness (instead of "
               "the TernGrad shape study)"), *NETWORK_OPTIONS),
          quick_run=dict(recorded_steps=5, Rs=(100, 1000))),
    Check("variance", "E||Q(g)-g||^2 and E||Q(g)||^2 of TernGrad and its peers vs exact formulas and published "
          "bounds", "variance",
          lambda a: dict(n=a.n, R=a.R, alpha=a.alpha, seed=a.seed, **network(a)),
          (Opt("--n", int, 3000, 300, "synthetic vector size"), Opt("--R", int, 1000, 200, "codec draws per vector"),
           Opt("--alpha", float, 1e-3, 1e-3, "family-wise level"), _seed(), *NETWORK_OPTIONS),
          quick_run=dict(recorded_steps=5)),
    Check("bound", "Assumption 3: envelopes A + B||w-w*||^2 of ||g||^2 and E||Q(g)||^2 along least-squares "
          "trajectories; per-layer ratios of an MLP", "bound",
          lambda a: dict(seeds=tuple(range(a.seeds)), steps=a.steps, mlp_steps=a.mlp_steps, **network(a)),
          (Opt("--seeds", int, 4, 1, "least-squares seeds"), Opt("--steps", int, 800, 100, "least-squares steps"),
           Opt("--mlp-steps", int, 300, 30, "MLP (or --model) training steps"), *NETWORK_OPTIONS)),
    Check("assumption1", "sign of (w-w*)^T grad C(w) along trajectories; non-convex control", "assumption1",
          lambda a: dict(seeds=tuple(range(a.seeds)), steps=a.steps),
          (Opt("--seeds", int, 3, 1, "seeds"), Opt("--steps", int, 400, 50, "least-squares steps")),
          quick_run=dict(toy_steps=50)),
    Check("convergence", "Robbins-Monro vs constant steps on noisy least squares: decay exponent, floors vs "
          "the quantizer's variance at w*", "convergence",
          lambda a: dict(seeds=a.seeds, floor_seeds=a.floor_seeds, steps=a.steps, lr=a.lr, tau=a.tau),
          (Opt("--seeds", int, 20, 3, "Robbins-Monro seeds"), Opt("--floor-seeds", int, 4, 2, "constant-step seeds"),
           Opt("--steps", int, 2000, 200, "steps per run"), Opt("--lr", float, 0.5, 0.5, "Robbins-Monro lr"),
           Opt("--tau", float, 50.0, 50.0, "Robbins-Monro decay scale")),
          quick_run=dict(n=8192)),        # still more samples than 200 steps x 4 workers x 8 draw: all fresh
    Check("clipping", "per-layer clipping statistics over MLP training: fraction clipped, length, angle, bias",
          "clipping", lambda a: dict(seed=a.seed, steps=a.steps, every=a.every, **network(a)),
          (_seed(), Opt("--steps", int, 300, 30, "MLP (or --model) training steps"),
           Opt("--every", int, 5, 5, "record every this many steps"), *NETWORK_OPTIONS)),
    Check("sharing", "variance added by scaler sharing, iid vs Dirichlet shards, 8 workers", "sharing",
          lambda a: dict(seed=a.seed, R=a.R),
          (_seed(), Opt("--R", int, 200, 50, "codec draws")),
          quick_run=dict(at=(0, 20))),
)


def apply_defaults(args: argparse.Namespace, defaults: dict[str, tuple[Any, Any]]) -> None:
    """Fill every option left at None (not given on the command line) from `defaults` = {dest: (full,
    quick)}: its quick value when args.quick, else its full default."""
    quick = bool(getattr(args, "quick", False))
    for dest, (full, quick_value) in defaults.items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, quick_value if quick else full)


def run_kwargs(check: Check, args: argparse.Namespace) -> dict:
    """The keyword arguments of the check's `run` for these (parsed) arguments, defaults resolved."""
    apply_defaults(args, {o.dest: (o.full, o.quick) for o in check.options})
    kwargs = check.kwargs(args)
    return {**kwargs, **check.quick_run} if args.quick else kwargs


def _runner(check: Check):
    def func(args) -> int:
        kwargs = run_kwargs(check, args)
        mod = importlib.import_module(f"tgsim.analysis.{check.module}")
        t0 = time.perf_counter()
        try:
            frames = mod.run(args.out, **kwargs)
        except ConfigError as e:     # bad input named before any work: one line, exit 2
            print(f"tgsim analyze {check.name}: {e}", file=sys.stderr)
            return 2
        print(f"\nwrote {', '.join(f'{k}.csv' for k in frames)} to {args.out}/ "
              f"({time.perf_counter() - t0:.1f} s{', --quick' if args.quick else ''})")
        return 0
    return func


def quick_help(check: Check) -> str:
    """The --quick help line: the options it changes, then the `run` arguments it sets."""
    changes = [f"{o.flag} {o.quick}" for o in check.options if o.quick != o.full]
    changes += [f"{k}={v}" for k, v in check.quick_run.items()]
    return "small parameters, a few seconds: " + ", ".join(changes)


def _add_check(sub, check: Check) -> None:
    p = sub.add_parser(check.name, help=check.help)
    p.add_argument("--out", default=str(DEFAULT_OUT), help="directory for the CSVs (default %(default)s)")
    p.add_argument("--quick", action="store_true", help=quick_help(check))
    for o in check.options:
        default = "" if o.full == o.quick == "" else f" (default {o.full}; --quick {o.quick})"
        p.add_argument(o.flag, type=o.type, default=None, help=f"{o.help}{default}")
    p.set_defaults(func=_runner(check))


def register(sub) -> None:
    """Add the seven checks to the `tgsim analyze` sub-parser action `sub`."""
    for check in CHECKS:
        _add_check(sub, check)


def main(argv=None) -> int:  # pragma: no cover - convenience: python -m tgsim.analysis.checks_cli
    p = argparse.ArgumentParser(prog="tgsim analyze")
    sub = p.add_subparsers(dest="check", required=True)
    register(sub)
    args = p.parse_args(argv)
    return args.func(args)
