"""`tgsim analyze <check>`: one subcommand per check; each writes tidy CSVs to --out DIR (default
results/analysis) and prints a summary; --quick runs it on small parameters in a few seconds."""

from __future__ import annotations

import argparse


def add_subcommands(parser: argparse.ArgumentParser) -> None:
    """Add every check (the seven theory checks, perfmodel-fig5, perfmodel-validate) under `parser`."""
    sub = parser.add_subparsers(dest="check", required=True)
    # Checks register here: sub.add_parser(name, help=...).set_defaults(func=callable(args) -> int)
    from tgsim.analysis.checks_cli import register as _register_theory_checks  # light imports only

    _register_theory_checks(sub)   # unbiasedness, variance, bound, assumption1, convergence, clipping, sharing
    from tgsim.analysis import perfmodel

    perfmodel.register_cli(sub)    # perfmodel-fig5, perfmodel-validate
    from tgsim.analysis import run_health

    run_health.register_cli(sub)   # run-health RUN_DIR
