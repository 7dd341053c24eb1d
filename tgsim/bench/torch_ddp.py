"""`tgsim bench torch`: tgsim's DDP comm hook against the backward pass and against DDP's own
all-reduce and fp16 hooks, on the CPU over Gloo, as ratios measured in one run.

    tgsim bench torch [--quick] [--out results/bench_torch.csv] [--rates none,10gbit,1gbit,100mbit] [--width 16]
                      [--input digits|cifar10] [--model package.module:function [--input-shape 1,8,8]
                      [--classes 10]] [...]
    python -m tgsim.bench.torch_ddp [...]

Per network setting (`--rates`: "none" is the loopback unshaped; a tc rate shapes it) one mpiexec
job of N ranks runs `python -m tgsim.bench.torch_ddp_rank` (its docstring: the variants, the
interleaved rounds, the columns it measures). MPI is forced onto TCP over the loopback in every
setting (MPICH: MPIR_CVAR_NOLOCAL=1, the ofi netmod, libfabric's tcp provider on lo, as netem.sh
does), so the hook's mpi4py traffic crosses the same link as Gloo's. A shaped setting runs through
netem.sh (`--module tgsim.bench.torch_ddp_rank`) in its shared topology: a private network
namespace whose loopback carries `tc tbf rate RATE`, as `tgsim bench exchange` shapes it. Shaping needs root or CAP_SYS_ADMIN +
CAP_NET_ADMIN (`tgsim.bench.exchange.check_environment`); without it the shaped settings are skipped
with the reason printed and only the unshaped one runs.

The ResNet's width (`--width`) sets the parameters the hook moves, the images (`--input`: digits,
1 x 8 x 8, or cifar10, tensors of CIFAR-10's 3 x 32 x 32 shape) the backward work per parameter:
hook_over_backward falls as the images grow, since the hook's work depends on the parameters only.
`--model package.module:function` times your own module instead (a factory as in a config's [model]
options, built by tgsim.models.make_model; `--input-shape` one sample's shape, default the --input's
flat vector; `--classes`; N(0, 1) inputs: tgsim.bench.torch_ddp_rank's docstring). The ranks run in
the environment you launch the bench from: no thread variable is set for them (each rank sets
torch's intra-op threads to 1, as the hook's users do).

Ratios added to every row (same run, same network setting):

  hook_over_backward       t_hook / t_backward(local): the time the tgsim hook's calls hold the backward
                           pass in a step (its encode + exchange + decode, less what its worker thread
                           did while the backward pass went on: tgsim.torch.ddp_bucket) over the backward
                           pass of the module alone (no DDP, no communication); target <= TARGET (10 %).
                           tgsim rows
  hook_over_backward_best  the same ratio of the fastest rounds (the least disturbed)
  codec_over_backward      t_hook_codec / t_backward(local): the hook's own computing (t_hook less
                           its time inside MPI calls, transfers and waits; the busiest rank) over the
                           backward pass: the part of the target the codec and the hook control (with
                           several DDP buckets the MPI calls on the hook's worker thread overlap the
                           backward pass, and the difference understates it)
  comm_over_backward       (t_backward - t_backward(local)) / t_backward(local): what DDP's backward
                           pass (with its hook or all-reduce) adds to the module's own, over it; every
                           row but `local` (noise can make it negative)
  t_exposed                t_step - t_step(local) - own work: the communication the step waits for
                           (own work: t_hook_codec on tgsim rows, 0 on DDP's, whose casts are few); the
                           rest of the exchange overlapped the backward pass
  exposed_vs_fp16          t_exposed / t_exposed(ddp_fp16), same rate: at most 1 is the issue's target
                           at 1 Gb/s and 100 Mb/s (noise can make either negative: then it is empty)
  step_vs_allreduce        t_step / t_step(ddp_allreduce): the whole training step (forward, backward
                           with DDP's communication, SGD step) against DDP's default all-reduce
  bits_ratio               bits_per_step(ddp_allreduce) / bits_per_step: how many times fewer bits a
                           rank sends per step than under DDP's float32 ring all-reduce (DDP's own:
                           the model 32 or 16 bits x P x 2 (N - 1) / N; tgsim: counted)
  meets_target             hook_over_backward <= TARGET (tgsim rows; empty otherwise)
  load_avg, spread, warning    tgsim.bench.timing.judge over the row's step, backward and hook timings
  quick                    True when --quick wrote the CSV (a smoke test: numbers not for reporting)
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tgsim.bench.torch_ddp_rank import DIGITS, INPUTS, RESNET, VARIANTS, parse_shape

FULL = dict(rates=("none", "10gbit", "1gbit", "100mbit"), ranks=2, steps=100, warmup=5)
QUICK = dict(rates=("none",), ranks=2, steps=3, warmup=1)
TARGET = 0.10
WIDTH = 16
INPUT = DIGITS
BASELINE = "ddp_allreduce"
FP16 = "ddp_fp16"
REFERENCE = "local"
QUICK_COLUMN = "quick"
QUICK_MARK = "QUICK (tgsim bench torch --quick: a smoke test, numbers not for reporting)"
MPI_OVER_TCP = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "lo",
                "GLOO_SOCKET_IFNAME": "lo"}     # no thread variables: the ranks run in the user's environment
COLUMNS = ["hook_over_backward", "hook_over_backward_best", "codec_over_backward", "comm_over_backward",
           "t_exposed", "exposed_vs_fp16", "step_vs_allreduce", "bits_ratio",
           "meets_target",
           "load_avg", "spread", "warning", QUICK_COLUMN]


def check_launch() -> tuple[bool, str]:
    """(ok, reason): are torch, mpi4py and an mpiexec there to run the ranks (unshaped)?"""
    from tgsim.bench.exchange import _mpiexec

    for mod, how in (("torch", "pip install -e '.[torch]'"), ("mpi4py", "pip install -e '.[mpich]'"),
                     ("sklearn", "pip install scikit-learn")):
        try:
            __import__(mod)
        except ImportError:
            return False, f"{mod} is not installed ({how})"
    if _mpiexec() is None:
        return False, "no mpiexec next to the interpreter or on PATH (pip install -e '.[mpich]')"
    return True, "ok"


def command(rate: str, ranks: int, raw_csv: Path, store: Path, steps: int, warmup: int,
            variants=None, width: int = WIDTH, image: str = INPUT, model: dict | None = None) -> list[str]:
    """The command line of one setting: mpiexec of the rank program, or for a shaped rate netem.sh's
    shared topology running it (`tgsim.bench.exchange.NETEM --module tgsim.bench.torch_ddp_rank`).
    `model`: {"factory", "input_shape" (a tuple or None), "classes"} of a user's model."""
    from tgsim.bench.exchange import NETEM, _mpiexec, rate_bits

    args = ["--store", str(store), "--out", str(raw_csv), "--steps", str(steps), "--warmup", str(warmup),
            "--rate", rate, "--width", str(width), "--input", image]
    args += ["--variants", ",".join(variants)] if variants else []
    if model:
        args += ["--model", model["factory"], "--classes", str(model["classes"])]
        args += ["--input-shape", ",".join(map(str, model["input_shape"]))] if model.get("input_shape") else []
    if rate == "none":
        return [_mpiexec(), "-n", str(ranks), sys.executable, "-m", "tgsim.bench.torch_ddp_rank", *args]
    rate_bits(rate)                                   # ValueError for a rate tc would not take
    return ["bash", str(NETEM), "--topology", "shared", "--rate", rate, "--ranks", str(ranks), "--python",
            sys.executable, "--module", "tgsim.bench.torch_ddp_rank", "--", *args]


def run_setting(rate: str, ranks: int, raw_csv: Path, steps: int, warmup: int, variants=None,
                timeout: float = 600.0, width: int = WIDTH, image: str = INPUT, model: dict | None = None) -> int:
    """One mpiexec job (one network setting); its exit status (the output printed when it fails)."""
    with tempfile.TemporaryDirectory(prefix="tgsim-bench-torch-") as store:
        cmd = command(rate, ranks, raw_csv, Path(store), steps, warmup, variants, width, image, model)
        env = {**os.environ, **MPI_OVER_TCP}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
            print(out, file=sys.stderr)
            raise RuntimeError(f"tgsim bench torch: {rate} did not finish within {timeout} s: {' '.join(cmd)}")
    for line in out.splitlines():
        if line.startswith("[bench torch]") or proc.returncode:
            print(line, file=sys.stderr if proc.returncode else sys.stdout, flush=True)
    return proc.returncode


def summarize(raw):
    """The raw rows (one per rate and variant) with the ratios and trust columns of the module
    docstring."""
    import numpy as np

    from tgsim.bench import timing

    df = raw.copy().reset_index(drop=True)
    ref = df[df["variant"] == REFERENCE].set_index("rate")
    base = df[df["variant"] == BASELINE].set_index("rate")

    def per_rate(frame, col):
        return df["rate"].map(frame[col]).astype(float).to_numpy() if col in frame else np.full(len(df), np.nan)

    tgsim = df["variant"].str.startswith("tgsim_")
    df["hook_over_backward"] = np.where(tgsim, df["t_hook"] / per_rate(ref, "t_backward"), np.nan)
    df["hook_over_backward_best"] = np.where(tgsim, df["t_hook_min"] / per_rate(ref, "t_backward_min"), np.nan)
    local_bwd = per_rate(ref, "t_backward")
    df["codec_over_backward"] = np.where(tgsim, df["t_hook_codec"] / local_bwd, np.nan)
    df["comm_over_backward"] = np.where(df["variant"] != REFERENCE, (df["t_backward"] - local_bwd) / local_bwd, np.nan)
    own = np.where(tgsim, df["t_hook_codec"].astype(float), 0.0)
    df["t_exposed"] = np.where(df["variant"] != REFERENCE, df["t_step"] - per_rate(ref, "t_step") - own, np.nan)
    fp16_exposed = per_rate(df[df["variant"] == FP16].set_index("rate"), "t_exposed")
    df["exposed_vs_fp16"] = np.where((df["t_exposed"] > 0) & (fp16_exposed > 0), df["t_exposed"] / fp16_exposed,
                                     np.nan)
    df["step_vs_allreduce"] = df["t_step"] / per_rate(base, "t_step")
    bits = df["bits_per_step"].astype(float)
    df["bits_ratio"] = per_rate(base, "bits_per_step") / bits.where(bits > 0)     # nan for `local` (sends none)
    df["meets_target"] = [("yes" if h <= TARGET else "NO") if t else "" for h, t in
                          zip(df["hook_over_backward"], tgsim)]

    def spread(lo, hi, mid):
        return (df[hi] - df[lo]) / df[mid]

    spreads = np.vstack([spread("t_step_min", "t_step_max", "t_step"),
                         spread("t_backward_min", "t_backward_max", "t_backward"),
                         np.where(tgsim, spread("t_hook_min", "t_hook_max", "t_hook"), np.nan)])
    df["spread"] = np.nanmax(spreads, axis=0)
    df["load_avg"] = df["loadavg"].astype(float)
    resolution = timing.clock_resolution()
    shortest = np.nanmin(np.vstack([df["t_step"], np.where(tgsim, df["t_hook"], np.nan)]), axis=0)
    df["warning"] = [timing.judge(float(sp), int(st), float(t), float(ld), int(c), resolution)
                     for sp, st, t, ld, c in zip(df["spread"], df["steps"], shortest, df["load_avg"], df["cores"])]
    return df


def sweep(rates, ranks=2, steps=30, warmup=3, variants=None, out=None, quick=False, shaping=None, width=WIDTH,
          image=INPUT, model=None):
    """Run every network setting (`rates`; shaped ones only where `check_environment()` allows, else
    skipped with the reason in df.attrs["skipped"]); returns the summarized rows (also written to
    `out`), QUICK_COLUMN = `quick` in every row; `model` as `command`'s. RuntimeError when nothing could
    run."""
    import pandas as pd

    from tgsim.bench.exchange import check_environment

    ok, why = check_launch()
    if not ok:
        raise RuntimeError(f"tgsim bench torch cannot run here: {why}")
    if any(r != "none" for r in rates):
        shaping = check_environment() if shaping is None else shaping
    skipped, failures = [], []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tgsim-bench-torch-") as tmp:
        raw_csv = Path(tmp) / "raw.csv"
        for rate in rates:
            if rate != "none" and not shaping[0]:
                skipped.append((rate, shaping[1]))
                print(f"[bench torch] {rate}: skipped, cannot shape the loopback here: {shaping[1]}", flush=True)
                continue
            t1 = time.monotonic()
            rc = run_setting(rate, ranks, raw_csv, steps, warmup, variants, width=width, image=image, model=model)
            print(f"[bench torch] {rate} N={ranks}: exit {rc} in {time.monotonic() - t1:.0f} s "
                  f"(total {time.monotonic() - t0:.0f} s)", flush=True)
            if rc:
                failures.append((rate, rc))
        if not raw_csv.exists():
            raise RuntimeError(f"tgsim bench torch: no measurements were written (failures: {failures}, "
                               f"skipped: {skipped})")
        raw = pd.read_csv(raw_csv, keep_default_na=False, na_values=["nan", ""])
    df = summarize(raw)
    df[QUICK_COLUMN] = bool(quick)
    df = df[[c for c in df.columns if c not in COLUMNS] + COLUMNS]
    df.attrs["failures"], df.attrs["skipped"] = failures, skipped
    if out:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out, index=False)
    return df


def print_table(df, file=None) -> None:
    """The rows as a table: times in ms, the ratios, bits per step; the machine line and warnings."""
    import numpy as np

    from tgsim.bench import timing

    file = file or sys.stdout
    if QUICK_COLUMN in df.columns and bool(df[QUICK_COLUMN].astype(bool).any()):
        print(QUICK_MARK, file=file)
    load = float(np.nanmax(df["load_avg"])) if len(df) else timing.load_average()
    cores = int(df["cores"].iloc[0]) if len(df) else timing.core_count()
    print(timing.machine_line(load, cores, timing.clock_resolution()), file=file)
    r0 = df.iloc[0]
    if not isinstance(r0.get("model"), str) or r0.get("model") == RESNET:       # CSVs before the column: the ResNet
        image = f"{r0.input} images of {int(r0.channels)} x {math.isqrt(int(r0.dim) // int(r0.channels))}^2"
        net = f"ResNet ({RESNET}, width {int(r0.width)})"
    else:
        image = f"N(0, 1) inputs of shape {r0.input}"
        net = f"your model ({r0.model})"
    print(f"{net} of {int(r0.params):,} parameters, "
          f"{int(r0.batch)} {image} per rank, {int(r0.ranks)} ranks, DDP over Gloo on the CPU, "
          f"{int(r0.steps)} timed rounds; medians over rounds (times: the slowest rank; hook: the rank that "
          "waited least in it; codec: the hook less its MPI calls, over bwd, the busiest rank)", file=file)
    print(f"{'rate':7} {'variant':25} {'step ms':>8} {'fwd ms':>7} {'bwd ms':>7} {'hook ms':>8} "
          f"{'hook/bwd':>8} {'best':>6} {'ok':>3} {'codec':>6} {'+bwd':>7} {'step/ar':>7} {'kbit/step':>10} "
          f"{'bits x':>7} {'exp ms':>7} {'exp/f16':>7}  source",
          file=file)

    def pct(v):
        return "" if v != v else f"{100 * v:.1f}%"

    for r in df.itertuples(index=False):
        hook = "" if r.t_hook != r.t_hook else f"{r.t_hook * 1e3:.2f}"
        ok = r.meets_target if isinstance(r.meets_target, str) else ""     # empty (NaN once read back) off tgsim rows
        print(f"{r.rate:7} {r.variant:25} {r.t_step * 1e3:8.2f} {r.t_forward * 1e3:7.2f} {r.t_backward * 1e3:7.2f} "
              f"{hook:>8} {pct(r.hook_over_backward):>8} {pct(r.hook_over_backward_best):>6} {ok:>3} "
              f"{pct(r.codec_over_backward):>6} {pct(r.comm_over_backward):>7} {r.step_vs_allreduce:7.2f} "
              f"{r.bits_per_step / 1e3:10.1f} "
              f"{r.bits_ratio:7.2f} {'' if r.t_exposed != r.t_exposed else f'{r.t_exposed * 1e3:.2f}':>7} "
              f"{'' if r.exposed_vs_fp16 != r.exposed_vs_fp16 else f'{r.exposed_vs_fp16:.2f}':>7}  {r.bits_source}",
              file=file)
    warned = [r for r in df.itertuples(index=False) if isinstance(r.warning, str) and r.warning]
    for r in warned:
        print(f"warning {r.rate} {r.variant}: {r.warning}", file=file)
    if warned:
        print(f"WARNING: {len(warned)} of {len(df)} rows warn: their times and ratios are not reliable", file=file)
    for rate, why in df.attrs.get("skipped", []):
        print(f"skipped {rate}: {why}", file=file)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `tgsim bench torch` (for tgsim/cli.py)."""
    p.add_argument("--quick", action="store_true", help="unshaped loopback only, 3 timed rounds: a smoke test; "
                   "every row of the CSV gets quick = True")
    p.add_argument("--rates", help="comma list: none (the loopback unshaped) and tc rates (default none,10gbit,1gbit,100mbit; "
                   "shaped ones need root)")
    p.add_argument("--ranks", type=int, help="MPI ranks (default 2)")
    p.add_argument("--steps", type=int, help="timed rounds per setting (default 100)")
    p.add_argument("--variants", help=f"comma list (default all: {','.join(VARIANTS)}); "
                   f"{REFERENCE} and {BASELINE} are the ratios' references")
    p.add_argument("--width", type=int, default=WIDTH, help="the example ResNet's width (default %(default)s: "
                   "about 43k parameters; 80: about 1.05M; 1 to 4 or a multiple of 4; not with --model)")
    p.add_argument("--input", default=INPUT, choices=sorted(INPUTS), help="the images: digits (1 x 8 x 8, "
                   "scikit-learn's) or cifar10 (3 x 32 x 32, CIFAR-10's shape, N(0, 1) pixels: about 16x the "
                   "backward work for nearly the same parameters); default %(default)s")
    p.add_argument("--model", help="package.module:function: time your own torch model instead of the ResNet (its "
                   "factory, as in a config's [model] options = {factory = ...})")
    p.add_argument("--input-shape", help="with --model: one sample's shape, e.g. 1,8,8 (default: the --input's flat "
                   "vector, 64 for digits)")
    p.add_argument("--classes", type=int, default=10, help="with --model: the number of classes (default %(default)s)")
    p.add_argument("--out", default="results/bench_torch.csv", help="CSV of every row")


def cmd(args) -> int:
    """`tgsim bench torch`: exit 0 on success, 1 when a setting failed, 3 when nothing can run here."""
    cfg = dict(QUICK if args.quick else FULL)
    if args.rates:
        cfg["rates"] = tuple(r.strip() for r in args.rates.split(",") if r.strip())
    if args.ranks:
        if args.ranks < 2:
            print("tgsim bench torch: --ranks must be >= 2", file=sys.stderr)
            return 2
        cfg["ranks"] = args.ranks
    if args.steps:
        cfg["steps"] = args.steps
    width = getattr(args, "width", WIDTH)
    model = None
    if getattr(args, "model", None):
        if width != WIDTH:
            print("tgsim bench torch: --width is the example ResNet's; --model times your own", file=sys.stderr)
            return 2
        problem = check_model(args)
        if isinstance(problem, str):
            print(f"tgsim bench torch: --model: {problem}", file=sys.stderr)
            return 2
        model = problem
    elif getattr(args, "input_shape", None):
        print("tgsim bench torch: --input-shape is for --model (the ResNet takes --input)", file=sys.stderr)
        return 2
    if width < 1 or (width > 4 and width % 4):
        print(f"tgsim bench torch: --width must be 1 to 4 or a multiple of 4 (the ResNet's GroupNorm of min(4, "
              f"width) groups), got {width}", file=sys.stderr)
        return 2
    variants = None
    if args.variants:
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        bad = [v for v in variants if v not in VARIANTS]
        if bad:
            print(f"tgsim bench torch: unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
            return 2
    from tgsim.bench.exchange import rate_bits

    try:
        for r in cfg["rates"]:
            if r != "none":
                rate_bits(r)
    except ValueError as e:
        print(f"tgsim bench torch: --rates: {e}", file=sys.stderr)
        return 2
    ok, why = check_launch()
    if not ok:
        print(f"tgsim bench torch: {why}", file=sys.stderr)
        return 3
    df = sweep(variants=variants, out=args.out, quick=bool(args.quick), width=width,
               image=getattr(args, "input", INPUT), model=model, **cfg)
    print()
    print_table(df)
    print(f"\nrows: {args.out}" + (" (quick = True: a smoke test)" if args.quick else ""))
    return 1 if df.attrs.get("failures") else 0


def check_model(args) -> dict | str:
    """`command`'s model dict of --model, --input-shape and --classes, or what is wrong with them (the
    factory is resolved and the module built here, before any rank starts)."""
    from tgsim.bench.torch_ddp_rank import INPUTS, build_model, model_options

    try:
        shape = parse_shape(args.input_shape) if args.input_shape else None
        if args.classes < 2:
            raise ValueError(f"--classes must be >= 2, got {args.classes}")
        build_model(model_options(args.model, shape or (INPUTS[getattr(args, "input", INPUT)][0],), args.classes))
    except (ImportError, ValueError, TypeError) as e:
        return str(e)
    return {"factory": args.model, "input_shape": shape, "classes": args.classes}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tgsim.bench.torch_ddp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return cmd(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
