"""Performance model of synchronous data-parallel training with a gradient codec (TernGrad Fig. 5):
its public names, the report of a validation, and the command line.

Two uses, one set of byte formulas, in these modules (each imports only those listed before it):
    perfmodel_nets        the networks: parameters and forward MACs per layer, compute time per batch
    perfmodel_throughput  1. training throughput (Fig. 5): bytes per layer, clusters, exchange patterns,
                          one iteration with wait-free backprop, throughput and gain tables, the claims
    perfmodel_emulation   2. the emulated network of `tgsim bench exchange`: MPICH's bytes per
                          collective, `EmuParams`, the predicted components of one bench row
    perfmodel_fit         calibrate `EmuParams` on some bench rows, validate the prediction of the rest
    perfmodel_ddp         the step as DDP over NCCL runs it (buckets, node-aware ring/tree, the code's
                          two parameter servers: rank 0's "ps" and the "sharded_ps" on the workers,
                          codec seconds on the critical path): `tgsim compare time`'s model;
                          perfmodel_verdict its intervals and wins, perfmodel_ddp_validate its check
                          against `tgsim bench exchange` and DDP over Gloo (`tgsim bench torch`)
    perfmodel             all of the above by name; `validation_summary`, `describe_params`,
                          `worst_rows`; `tgsim analyze perfmodel-fig5 | perfmodel-validate` and
                          `python -m tgsim.analysis.perfmodel fig5 | validate`

    df = fig5()                                           # tidy: net, cluster, gpus, codec, throughput, ...
    gain_table(df)                                        # TernGrad / fp32 throughput per (net, cluster, gpus)
    table = validate("results/bench_exchange.csv")       # every row: predicted vs measured
    validation_summary(table)                             # share within 20%, per topology/rate/mode

QUICK input. `tgsim bench exchange --quick` writes the same default CSV as a full run, with a column
quick = True. `perfmodel-validate` refuses such a CSV in one line on stderr (exit 2) naming the file
and --allow-quick; with --allow-quick, or under its own --quick (a smoke test that reads a CSV and
so may consume a smoke test's), it validates it and marks its output: the printed headlines start
with QUICK and perfmodel_validation.csv has quick = True (it writes no figure). Its --quick on a full
CSV computes what the full command does and is not marked. A CSV without the column (an older
tgsim) counts as not quick.
"""

from __future__ import annotations

from tgsim.analysis.perfmodel_emulation import (MODES, PIPELINED, EmuParams, bench_layer_sizes, message_header_bytes,
                                                mode_collectives, mode_payloads, mpich_collective_bytes,
                                                predict_components, predict_wire, wire_bytes_model)
from tgsim.analysis.perfmodel_fit import (CALIBRATIONS, calibrate, combine_sweeps, default_calibration_rows,
                                          predict_emulation, rank_ends_calibration_rows,
                                          size_ends_calibration_rows, validate)
from tgsim.analysis.perfmodel_throughput import (CLUSTERS, FIG5_NETS, Cluster, Exchange, Network,
                                                 claim_gain_grows_as_bandwidth_falls,
                                                 claim_gain_grows_with_fc_weights, claim_gain_grows_with_workers,
                                                 fig5, gain_table, iteration, layer_bytes, message_seconds,
                                                 throughput_table, uint_width)



def validation_summary(table):
    """Share of validation rows within tolerance, per topology, rate and mode (step, exchange, wire)."""
    v = table[table["split"] == "validation"]
    return v.groupby(["topology", "rate", "mode"]).agg(rows=("within", "size"), step_within=("within", "mean"),
                                                       exchange_within=("exchange_within", "mean"),
                                                       wire_within=("wire_within", "mean"),
                                                       median_abs_error=("rel_error", lambda x: x.abs().median()))


def describe_params(p: EmuParams, name: str = "") -> str:
    """The fitted parameters, readable: network constants, then per CPU cost its exponent and its
    ns per element at each calibrated size."""
    net = (f"eta {p.eta:.3f}, cap {p.cap / 1e9:.2f} GB/s x (N/2)^{p.kappa:.2f}, cap_root {p.cap_root / 1e9:.2f} GB/s / "
           f"o^{p.nu:.2f}, alpha {p.alpha * 1e6:.0f} us + {p.alpha_os * 1e6:.0f} us x (o-1) per round, "
           f"beta_sc {p.beta_sc * 1e3:.2f} ms x (o-1), q_exact {p.q_exact * 1e12:.1f} ps/B x (o-1), cores {p.cores:g}")
    cpu = []
    for attr in sorted({a for a, _ in p.cpu}):
        sizes = ", ".join(f"{P / 1e6:g}M {v * 1e9:.2f}"
                          + (f" (gamma {p.gammas[(a, P)]:.2f})" if (a, P) in p.gammas else "")
                          for (a, P), v in sorted(p.cpu.items()) if a == attr)
        cpu.append(f"    {attr:14s} gamma {p.gammas.get(attr, p.gamma):.3f}  ns/element: {sizes}")
    return "\n".join([f"{name}: {net}"] + cpu)


def worst_rows(table, k: int = 10, split: str = "validation"):
    """The k rows of `split` with the largest |rel_error| of t_step."""
    v = table[table["split"] == split]
    v = v.reindex(v["rel_error"].abs().sort_values(ascending=False).index)
    return v.head(k)[["topology", "rate", "ranks", "params", "mode", "t_step", "pred_t_step", "rel_error",
                      "t_wire", "pred_t_wire", "t_decode", "pred_t_decode"]]


CLI_OUT = "results/analysis"              # = tgsim.analysis.common.DEFAULT_OUT, as every `tgsim analyze` check
BENCH_CSV = "results/bench_exchange.csv"  # `tgsim bench exchange`'s default --out
FIG5_NAME, VALIDATION_NAME, DDP_TORCH_NAME = "perfmodel_fig5", "perfmodel_validation", "perfmodel_ddp_torch"
FIG5_QUICK_NETS = "alexnet"


def _out_arguments(p, name: str, quick_help: str) -> None:
    """--out DIR (name.csv is written inside it) and --quick, as every `tgsim analyze` check has them."""
    p.add_argument("--out", default=CLI_OUT, help=f"directory for {name}.csv (default %(default)s)")
    p.add_argument("--quick", action="store_true", help=quick_help)


def _fig5_arguments(f) -> None:
    """The arguments of `fig5` (python -m ... fig5, tgsim analyze perfmodel-fig5)."""
    _out_arguments(f, FIG5_NAME, f"small parameters: --nets {FIG5_QUICK_NETS}")
    f.add_argument("--pattern", default="ps", choices=["ps", "ring", "allgather"],
                   help="the Fig. 5 model's exchange (perfmodel_throughput.Exchange): ps = the paper's parameter "
                        "server on DEDICATED servers (--servers), not the code's rank-0 ps nor its sharded_ps, "
                        "which `tgsim compare time` models (perfmodel_ddp); default %(default)s")
    f.add_argument("--servers", type=int, default=1,
                   help="--pattern ps: dedicated server shards, each on a NIC of its own; 0: one per worker node "
                        "(default %(default)s: the paper's single server)")
    f.add_argument("--downlink", default="sum", choices=["sum", "reternarize"])
    f.add_argument("--nets", default=None,
                   help=f"comma list (default {','.join(FIG5_NETS)}; --quick {FIG5_QUICK_NETS})")
    f.set_defaults(func=_run_fig5, prog=f.prog)


def _validate_arguments(v) -> None:
    """The arguments of `validate` (python -m ... validate, tgsim analyze perfmodel-validate)."""
    v.add_argument("csv", nargs="*", default=[BENCH_CSV],
                   help="one bench CSV, or several sweeps of the same grid (their per-row medians are used)")
    v.add_argument("--calibration", default="default", choices=sorted(CALIBRATIONS),
                   help="rows to fit on: default = N = 2 + the smallest size at the largest N; size-ends = the "
                        "same without the middle sizes at N = 2; rank-ends = every row at the smallest and "
                        "largest N (the rows left out are predicted)")
    _out_arguments(v, VALIDATION_NAME, "the same run: its time is set by the CSV (the grid of `tgsim bench exchange "
                                      "--quick`, N = 2, 4 and 1M, 4M, takes about a second; the default "
                                      "calibration fits N = 2 and 1M at N = 4 and validates 4M at N = 4). "
                                      "A smoke test: it also accepts a CSV written by `tgsim bench exchange "
                                      "--quick` (as --allow-quick does); the output is marked QUICK when its "
                                      "input is, not otherwise (on a full CSV the numbers are the full run's)")
    v.add_argument("--allow-quick", action="store_true",
                   help="use a CSV written by `tgsim bench exchange --quick` (its `quick` column; refused "
                        "otherwise, exit 2); the printed tables, perfmodel_validation.csv (column quick) then "
                        "say QUICK. A CSV without the column (an older tgsim) counts as not quick")
    v.add_argument("--torch-csv", help="also validate the DDP model's buckets and overlap against a `tgsim bench "
                   "torch` CSV (variants local, ddp_allreduce, ddp_fp16): printed, and written to "
                   f"{DDP_TORCH_NAME}.csv; with only this and no bench exchange CSV at the default path, only it runs")
    v.set_defaults(func=_run_validate, prog=v.prog)


def _bad_out(args, name: str) -> bool:
    """True (after one line on stderr) when --out names a .csv file instead of a directory."""
    import sys

    if not str(args.out).lower().endswith(".csv"):
        return False
    print(f"{args.prog}: --out takes a directory ({name}.csv is written inside it), got {args.out}", file=sys.stderr)
    return True


def _write(df, out: str, name: str, t0: float, note: str = "") -> None:
    """df -> out/name.csv (directory created), and the line that says so (+ note)."""
    import time
    from pathlib import Path

    Path(out).mkdir(parents=True, exist_ok=True)
    df.to_csv(Path(out) / f"{name}.csv", index=False)
    print(f"\nwrote {name}.csv to {out}/ ({time.perf_counter() - t0:.1f} s){note}")


def _run_fig5(args) -> int:
    """Throughput vs GPUs, fp32 vs TernGrad, both clusters: print the gains, write perfmodel_fig5.csv."""
    import time

    import pandas as pd

    if _bad_out(args, FIG5_NAME):
        return 2
    t0 = time.perf_counter()
    nets = args.nets or (FIG5_QUICK_NETS if args.quick else ",".join(FIG5_NETS))
    df = fig5(tuple(nets.split(",")), Exchange(args.pattern, servers=args.servers, downlink=args.downlink))
    g = gain_table(df)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(g.pivot_table(index=["cluster", "net"], columns="gpus", values="gain").round(2))
    _write(df.merge(g[["net", "cluster", "gpus", "gain"]], on=["net", "cluster", "gpus"]), args.out, FIG5_NAME, t0)
    return 0


def _missing_measurements(args) -> bool:
    """True (after one line on stderr naming the missing file and the command that makes it) when a
    measurement CSV does not exist."""
    import sys
    from pathlib import Path

    missing = [c for c in args.csv if not Path(c).is_file()]
    if not missing:
        return False
    make = " ".join(["tgsim bench exchange"] + ([] if missing[0] == BENCH_CSV else ["--out", missing[0]]))
    print(f"{args.prog}: no measurements at {', '.join(missing)}: make them with `{make}` "
          f"(needs root; --quick: about a minute)", file=sys.stderr)
    return True


def _quick_inputs(paths) -> list[tuple[str, str]]:
    """(path, its grid) of every measurement CSV written by `tgsim bench exchange --quick` (its quick
    column; a CSV without one counts as not quick)."""
    import pandas as pd

    from tgsim.bench.exchange import is_quick, quick_description

    out = []
    for path in paths:
        rows = pd.read_csv(path)
        if is_quick(rows):
            out.append((str(path), quick_description(rows)))
    return out


def _refused_quick(args) -> bool:
    """True (after one line on stderr naming the file and --allow-quick) when a measurement CSV was
    written by `tgsim bench exchange --quick` and neither --allow-quick nor --quick was given."""
    import sys

    if args.allow_quick or args.quick:
        return False
    quick = _quick_inputs(args.csv)
    if not quick:
        return False
    path, grid = quick[0]
    more = f" (and {len(quick) - 1} more of the CSVs given)" if len(quick) > 1 else ""
    print(f"{args.prog}: {path}{more} was written by `tgsim bench exchange --quick` ({grid}: a smoke test); "
          f"rerun tgsim bench exchange without --quick, or pass --allow-quick to use it (the output is then "
          f"marked QUICK)", file=sys.stderr)
    return True


def _print_validation(out) -> None:
    """The fitted parameters, the share of rows within 20% (per topology, rate, mode) and the worst rows;
    every headline starts with QUICK when the measurements came from `tgsim bench exchange --quick`."""
    import pandas as pd

    from tgsim.bench.exchange import QUICK_MARK

    quick = bool(out["quick"].any()) if "quick" in out else False
    mark = "QUICK " if quick else ""
    if quick:
        print(f"{QUICK_MARK}; every row below is of its grid")
    for topo, p in out.attrs["params"].items():
        print(describe_params(p, topo))
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.max_columns", 30):
        print(f"{mark}share of validation rows within 20%, per topology, rate and mode:")
        print(validation_summary(out).round(2))
        v = out[out["split"] == "validation"]
        print(f"{mark}validation rows within 20%: t_step {v['within'].mean():.0%} ({int(v['within'].sum())}/{len(v)}), "
              f"t_exchange {v['exchange_within'].mean():.0%}, t_wire {v['wire_within'].mean():.0%}; "
              f"calibration rows (t_step): {out.loc[out['split'] == 'calibration', 'within'].mean():.0%}")
        print(v.groupby(["topology", "rate"])["within"].mean().round(2).to_string())
        for flag, part in v.groupby("oversubscribed"):
            print(f"  {'oversubscribed (N > cores)' if flag else 'one rank per core'}: t_step within 20% "
                  f"in {int(part['within'].sum())}/{len(part)} rows")
        if int(out["sweeps"].max()) > 1:
            noisy = v["sweep_spread"] > 0.20
            print(f"  medians of {int(out['sweeps'].max())} sweeps; {int(noisy.sum())}/{len(v)} validation rows "
                  f"differ by > 20% between sweeps; of the rows that do not, "
                  f"{int(v.loc[~noisy, 'within'].sum())}/{int((~noisy).sum())} are within 20%")
        print(f"{mark}worst validation rows:")
        print(worst_rows(out).round(4).to_string(index=False))


def _run_validate(args) -> int:
    """Calibrate on the measurements, print the validation, write perfmodel_validation.csv; exit 2
    (one line on stderr) when the CSV is missing, was written by `tgsim bench exchange --quick` without
    --allow-quick (or --quick), or the calibration leaves no row to validate. --torch-csv first prints
    and writes the DDP-over-Gloo validation (`_run_validate_torch`); alone, with no CSV at BENCH_CSV,
    only that runs."""
    import sys
    import time
    from pathlib import Path

    if _bad_out(args, VALIDATION_NAME):
        return 2
    if args.torch_csv:
        if _run_validate_torch(args):
            return 2
        if args.csv == [BENCH_CSV] and not Path(BENCH_CSV).is_file():
            return 0
    if _missing_measurements(args) or _refused_quick(args):
        return 2
    t0 = time.perf_counter()
    out = validate(args.csv, calibration=CALIBRATIONS[args.calibration])
    if not (out["split"] == "validation").any():
        print(f"{args.prog}: calibration {args.calibration!r} fits every row of this grid (N = "
              f"{', '.join(str(n) for n in sorted(set(out['ranks'])))}): nothing is left to validate; "
              f"use --calibration default", file=sys.stderr)
        return 2
    _print_validation(out)
    _write(out, args.out, VALIDATION_NAME, t0, ", QUICK: column quick = True" if out["quick"].any() else "")
    return 0


def _run_validate_torch(args) -> int:
    """`perfmodel_ddp_validate.print_ddp` on --torch-csv, written to DDP_TORCH_NAME.csv: 0; 2 (one line
    on stderr) when the CSV is missing or not a `tgsim bench torch` CSV of the bench's ResNet."""
    import sys
    import time
    from pathlib import Path

    from tgsim.analysis.perfmodel_ddp_validate import print_ddp

    if not Path(args.torch_csv).is_file():
        print(f"{args.prog}: no measurements at {args.torch_csv}: make them with `tgsim bench torch --width 80 "
              f"--variants local,ddp_allreduce,ddp_fp16 --out {args.torch_csv}` (shaped rates need root)",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        table = print_ddp(args.torch_csv)
    except ValueError as e:
        print(f"{args.prog}: {args.torch_csv}: {e}", file=sys.stderr)
        return 2
    _write(table, args.out, DDP_TORCH_NAME, t0)
    print()
    return 0


def register_cli(sub) -> None:
    """Add `perfmodel-fig5` and `perfmodel-validate` to an argparse subparsers object (for
    analysis/cli.py: `register_cli(sub)` inside `add_subcommands`); they run what `main`'s fig5 and
    validate run."""
    _fig5_arguments(sub.add_parser("perfmodel-fig5", help="TernGrad Fig. 5: throughput vs GPUs, fp32 vs TernGrad "
                                                         "(perfmodel_fig5.csv)"))
    _validate_arguments(sub.add_parser("perfmodel-validate", help="performance model vs `tgsim bench exchange` "
                                                                  "measurements (perfmodel_validation.csv)"))


def main(argv=None) -> int:
    """python -m tgsim.analysis.perfmodel fig5 [--out DIR] [--quick] | validate [CSV ...] [--out DIR] [--quick]
    [--allow-quick]"""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tgsim.analysis.perfmodel", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    _fig5_arguments(sub.add_parser("fig5", help="throughput vs GPUs, fp32 vs TernGrad, both clusters (tidy CSV)"))
    _validate_arguments(sub.add_parser("validate", help="predicted vs measured exchange times of `tgsim bench "
                                                        "exchange`"))
    args = ap.parse_args(argv)
    return args.func(args)


__all__ = ["CLUSTERS", "FIG5_NETS", "claim_gain_grows_as_bandwidth_falls", "claim_gain_grows_with_fc_weights",
           "claim_gain_grows_with_workers", "Cluster", "EmuParams", "Exchange", "MODES", "Network", "PIPELINED",
           "bench_layer_sizes", "calibrate", "fig5", "gain_table", "iteration", "layer_bytes",
           "message_header_bytes", "message_seconds", "mode_collectives", "mode_payloads",
           "mpich_collective_bytes", "predict_components", "predict_emulation", "predict_wire", "throughput_table",
           "uint_width", "validate", "validation_summary", "wire_bytes_model", "default_calibration_rows",
           "size_ends_calibration_rows", "rank_ends_calibration_rows", "CALIBRATIONS", "combine_sweeps",
           "describe_params", "main", "register_cli", "worst_rows"]


if __name__ == "__main__":
    raise SystemExit(main())
