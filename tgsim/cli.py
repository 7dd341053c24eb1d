"""Command line: `tgsim run | demo | plot | sweep | codecs | analyze | compare | bench | figures`, and `tgsim --version`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def builtin_config(name: str) -> Path:
    from tgsim.train.config import builtin_path

    path = builtin_path(name)
    if path is None:
        raise SystemExit(f"no built-in config {name!r}")
    return path


def _load_config(args):
    """The run's config: CONFIG.toml, or with --resume and no config the one saved in --out DIR.
    Raises ConfigError (one line for the user) when the file is not there."""
    from tgsim.train import config as config_mod
    from tgsim.errors import ConfigError

    if args.resume and args.config is None:
        if args.out is None:
            raise ConfigError("--resume needs --out DIR (the run to continue) or a config")
        path = Path(args.out) / "config.toml"
        if not path.is_file():
            raise ConfigError(f"no run to resume in {args.out}: {path} does not exist")
        return config_mod.load(path, args.set)
    if args.config is None:
        raise ConfigError("tgsim run needs a CONFIG.toml (or --resume --out DIR)")
    return config_mod.load(args.config, args.set)      # a path, or a built-in config's name (`demo`)


def _cmd_run(args) -> int:
    """Exit status: 0 done; 2 bad input, nothing written (a config or model error, a --resume that would
    change the run's config) or a non-finite gradient under run.on_nonfinite = "raise" (the steps before
    it checkpointed); 3 the run finished unhealthy (RunResult.unhealthy: too many skipped steps, a
    non-finite final loss). Each error is one line on stderr."""
    from tgsim.errors import ConfigError, is_nonfinite
    from tgsim.train.loop import run

    try:
        cfg = _load_config(args)
        res = run(cfg, out=args.out, resume=args.resume, quiet=args.quiet, allow_changes=args.allow_change,
                  tensorboard=args.tensorboard)
    except (ConfigError, FileExistsError) as e:
        print(f"tgsim run: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        if not is_nonfinite(e):
            raise
        print(f"tgsim run: {e}", file=sys.stderr)
        return 2
    if args.resume and res.start_step >= res.steps:
        print(f"the run in {res.out} was already complete ({res.steps} steps): nothing to do")
    elif args.resume:
        print(f"resumed at step {res.start_step} of {res.steps}")
    print(f"test loss {res.test_loss:.4f}  accuracy {res.test_accuracy:.4f}  "
          f"bits/worker up {res.bits_up:.3e} down {res.bits_down:.3e} (whole run)  skipped steps {res.skipped}")
    print(f"results: {res.out}")
    if res.unhealthy:
        print(f"tgsim run: unhealthy run: {res.unhealthy} (`tgsim analyze run-health {res.out}`)", file=sys.stderr)
    return res.exit_status


def _cmd_demo(args) -> int:
    from tgsim.train import config as config_mod
    from tgsim.train.loop import run

    base = config_mod.load(builtin_config("demo"), args.set)
    runs = (("fp32", ["codec.name='fp32'"]), ("terngrad", []), ("terngrad-max", ["codec.sharing='max'"]))
    rows = []
    for label, overrides in runs:
        cfg = config_mod.load(builtin_config("demo"), overrides + [f"run.name='demo-{label}'"] + args.set)
        print(f"== {label}: {cfg.model.name} on {cfg.data.name}, {cfg.workers.n} workers, {cfg.run.steps} steps")
        res = run(cfg, quiet=args.quiet, results_base=args.results)
        rows.append((label, res))
        print(f"   results: {res.out}")
    print(f"\n{'codec':13} {'test acc':>9} {'test loss':>10} {'Mbit up/worker':>15} {'Mbit down/worker':>17}")
    for label, r in rows:
        print(f"{label:13} {r.test_accuracy:9.4f} {r.test_loss:10.4f} {r.bits_up / 1e6:15.2f} {r.bits_down / 1e6:17.2f}")
    fp32, tg, tg_max = (r for _, r in rows)
    up = fp32.bits_up / max(tg.bits_up, 1)
    print(f"TernGrad (scalers shared as their mean, clipping at it) sent {up:.1f}x fewer bits up than fp32 "
          f"({base.exchange.mode} exchange), at fp32's learning rate {base.schedule.lr:g}: accuracy "
          f"{tg.test_accuracy - fp32.test_accuracy:+.4f} against fp32.")
    print(f"With the paper's MAX sharing at the same setting: accuracy {tg_max.test_accuracy:.4f} "
          f"(`tgsim analyze run-health {tg_max.out}` shows whether its units died).")
    print("One seed each. papers_figures/mnist1d_terngrad_vs_fp32.py tunes the learning rate on a validation "
          "split and compares 3 seeds of each on the test set.")
    prog = sys.argv[0] if Path(sys.argv[0]).name == "tgsim" else "tgsim"     # `.venv/bin/tgsim` under make demo
    print(f"Plot the three runs: {prog} plot {' '.join(str(r.out) for _, r in rows)} "
          f"--out {Path(args.results) / 'demo.png'}")
    return 0


def _cmd_codecs(args) -> int:
    """One line per registered codec with its declared properties (tgsim.codecs.base.CodecProperties),
    then each codec's [codec] options (its `Options`: key, default, help; "sweep": the values `tgsim
    compare` sweeps)."""
    from tgsim.codecs import registry

    rows = registry.describe()
    cols = ["codec", *(k for k in rows[0] if k not in ("codec", "source", "class", "options")), "source", "class"]
    for r in rows:
        r["backends"] = ",".join(r["backends"])
    width = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    print("  ".join(f"{c:<{width[c]}}" for c in cols).rstrip())
    for r in rows:
        print("  ".join(f"{str(r.get(c, '')):<{width[c]}}" for c in cols).rstrip())
    print("(properties of each codec's default config; terngrad is unbiased with clip = 'none'; plugins: "
          "entry points of the group 'tgsim.codecs', and any 'package.module:Class' works as a name)")
    print("\noptions ([codec] keys besides name, kernels and error_feedback; `key = default  help`):")
    for r in rows:
        print(f"{r['codec']}:" + ("" if r["options"] else " none"))
        for o in r["options"]:
            default = list(o["default"]) if isinstance(o["default"], tuple) else o["default"]
            extra = f" (one of {', '.join(map(str, o['choices']))})" if o["choices"] else ""
            sweep = f"; compare sweeps {', '.join(map(str, o['sweep']))}" if o["sweep"] else ""
            print(f"  {o['key']} = {default!r}  {o['help']}{extra}{sweep}")
    return 0


def _cmd_bench_codec(args) -> int:
    if args.backend:
        from tgsim.bench import codec_gpu

        kw = dict(n_elements=1 << 16, layers=4, layer_elements=1000, repeats=2) if args.quick else {}
        if args.elements:
            kw["n_elements"] = args.elements
        if args.repeats:
            kw["repeats"] = args.repeats
        print(codec_gpu.format_rows(codec_gpu.run(args.backend, workers=args.workers, **kw)))
        return 0
    from tgsim.bench import codec

    if args.codec or args.layers is not None:
        from tgsim.bench import codecs_all
        from tgsim.codecs import registry

        names = registry.names() if (args.codec or "all") == "all" else (args.codec,)
        for name in names:
            registry.codec_class(name)
        n = args.elements or (BENCH_CODEC_QUICK["elements"] if args.quick else 1 << 22)
        repeats = args.repeats or (BENCH_CODEC_QUICK["repeats"] if args.quick else 5)
        k = 1 if args.layers is None else args.layers
        if not 1 <= k <= n:
            print(f"tgsim bench codec: --layers {k} must be between 1 and the elements ({n})", file=sys.stderr)
            return 2
        print(codecs_all.format_rows(codecs_all.run(names, n, args.workers, repeats, layers=k), n, args.workers,
                                     layers=k))
        return 0
    n = args.elements or (BENCH_CODEC_QUICK["elements"] if args.quick else 16_777_216)
    repeats = args.repeats or (BENCH_CODEC_QUICK["repeats"] if args.quick else 5)
    print(codec.header(n))
    print(codec.format_rows(codec.run(n_elements=n, workers=args.workers, repeats=repeats)))
    return 0


def _cmd_bench_sim(args) -> int:
    if args.backend:
        from tgsim.bench import sim_gpu

        kw = dict(workers=(2, 4), repeats=2) if args.quick else {}
        if args.repeats:
            kw["repeats"] = args.repeats
        print(sim_gpu.format_rows(sim_gpu.run(args.backend, **kw), args.backend))
        return 0
    from tgsim.bench import sim

    quick = BENCH_SIM_QUICK if args.quick else {}
    repeats = args.repeats or quick.get("repeats", 15)
    sim.print_report(sim.run(workers=quick.get("workers", (1, 8, 32, 128)), repeats=repeats))
    return 0


def _figures_folder() -> Path:
    """The figure scripts' folder: tgsim.papers_figures (papers_figures/ in a checkout)."""
    from tgsim import papers_figures

    return Path(next(iter(papers_figures.__path__)))


def _cmd_figures(args) -> int:
    """Run figure scripts from the installed package: no NAME runs make_report.py (every figNN script
    and REPORT.md), else the named scripts (`fig02`, `least_squares_robbins_monro`, ...). Outputs go to
    --out (default $TGSIM_FIGURES_OUT, else ./tgsim-figures); quick runs to OUT/quick."""
    import subprocess

    here = _figures_folder()
    scripts = sorted(p.stem for p in here.glob("*.py") if not p.name.startswith("_") and p.stem != "make_report")
    if args.list:
        print("\n".join(scripts))
        return 0
    chosen = []
    for name in args.names:
        hits = [s for s in scripts if s == name or s.startswith(name + "_")]
        if len(hits) != 1:
            print(f"tgsim figures: {name!r} names {len(hits)} scripts; expected one of: {', '.join(scripts)}",
                  file=sys.stderr)
            return 2
        chosen += hits
    out = Path(args.out or os.environ.get("TGSIM_FIGURES_OUT") or "tgsim-figures").resolve()
    env = {**os.environ, "TGSIM_FIGURES_OUT": str(out), "MPLBACKEND": os.environ.get("MPLBACKEND", "Agg")}
    flags = ["--quick"] if args.quick else []
    if not chosen:
        cmd = [sys.executable, str(here / "make_report.py"), *flags, *(["--quiet"] if args.quiet else [])]
        return subprocess.run(cmd, env=env).returncode
    for name in chosen:
        if not args.quiet:
            print(f"figure {name}: started", flush=True)
        rc = subprocess.run([sys.executable, str(here / f"{name}.py"), *flags], env=env).returncode
        if rc:
            print(f"tgsim figures: {name} failed (exit {rc})", file=sys.stderr)
            return rc
    print(f"outputs: {out / 'quick' if args.quick else out}")
    return 0


# `--quick`: the same rows on small sizes, a smoke test of the code paths (numbers not for reporting)
BENCH_CODEC_QUICK = {"elements": 1 << 18, "repeats": 2}
BENCH_SIM_QUICK = {"workers": (1, 8), "repeats": 3}


def build_parser() -> argparse.ArgumentParser:
    from tgsim import __version__

    p = argparse.ArgumentParser(prog="tgsim", description="TernGrad and its peers: codec, simulator, analysis.")
    p.add_argument("--version", action="version", version=f"tgsim {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="train with N virtual workers per a TOML config; writes a results directory")
    r.add_argument("config", nargs="?", help="CONFIG.toml, or a built-in config's name (demo); omit with "
                   "--resume --out DIR")
    r.add_argument("--out", help="results directory (default results/<name>-<time>)")
    r.add_argument("--resume", action="store_true", help="continue the run in --out from its newest good checkpoint")
    r.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value")
    r.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    r.add_argument("--allow-change", action="append", default=[], metavar="SECTION.KEY",
                   help="with --resume: accept this key's change against the run's config.toml (recorded in "
                        "resumes.jsonl); run.steps, run.log_every, ... need none (README 'A run')")
    r.add_argument("--tensorboard", metavar="DIR", help="also write metrics.csv's scalars as TensorBoard event "
                   "files into DIR ([run] tensorboard = true: RUN_DIR/tensorboard; needs tgsim[tensorboard])")
    r.set_defaults(func=_cmd_run)

    d = sub.add_parser("demo", help="train the built-in demo config with fp32 and with TernGrad, print both")
    d.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    d.add_argument("--results", default="results", help="where results directories go")
    d.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    d.set_defaults(func=_cmd_demo)

    from tgsim.runs import plot as runs_plot, sweep as runs_sweep  # light: pandas and matplotlib load when they run

    pl = sub.add_parser("plot", help="loss and accuracy against steps and bits, per-layer statistics and "
                                     "run-health alerts of one or several runs, overlaid (PNG)")
    runs_plot.add_arguments(pl)
    pl.set_defaults(func=runs_plot.cmd)
    sw = sub.add_parser("sweep", help="a grid of runs of one config (--set key=v1,v2,... --seeds K) into one "
                                      "directory with runs.csv; run it again to continue")
    runs_sweep.add_arguments(sw)
    sw.set_defaults(func=runs_sweep.cmd)

    c = sub.add_parser("codecs", help="list the registered codecs and their declared properties")
    c.set_defaults(func=_cmd_codecs)

    a = sub.add_parser("analyze", help="statistical checks of the codec and the theorem's assumptions (CSV out)")
    from tgsim.analysis import cli as analysis_cli  # light: imports nothing heavy until a check runs

    analysis_cli.add_subcommands(a)
    from tgsim.analysis import compare_cli  # light: the comparisons import their modules when they run

    compare_cli.register(sub)      # compare variance | speedup

    b = sub.add_parser("bench", help="benchmarks that print ratios measured in one run")
    bsub = b.add_subparsers(dest="what", required=True)
    bc = bsub.add_parser("codec", help="fused kernels against the array reference and the memory bandwidth")
    bc.add_argument("--elements", type=int, help="gradient size (default 16,777,216 = 64 MiB of float32)")
    bc.add_argument("--workers", type=int, default=8, help="payloads summed in the decode benchmark")
    bc.add_argument("--repeats", type=int, help="timed calls per row (default 5)")
    bc.add_argument("--quick", action="store_true", help="2^18 elements, 2 repeats: a smoke test, not a measurement")
    bc.add_argument("--codec", help="'all' or a registered codec: encode and aggregate of every codec as ratios "
                    "(default 2^22 elements; tgsim.bench.codecs_all) instead of TernGrad's kernels")
    bc.add_argument("--layers", type=int, help="K: also encode and aggregate the same elements as K layers, and "
                    "print their times over the one layer's, per codec (implies --codec all unless one is named)")
    bc.add_argument("--backend", choices=("cupy", "numpy"), help="TernGrad's whole encode (one 64M layer and a "
                    "100 x 100k step) and aggregate of 8 against read passes, on CuPy (GPU) or NumPy "
                    "(tgsim.bench.codec_gpu)")
    bc.set_defaults(func=_cmd_bench_codec)
    bs = bsub.add_parser("sim", help="batched virtual workers against a per-worker loop and against one process "
                                     "on the whole batch; peak memory")
    bs.add_argument("--repeats", type=int, help="interleaved rounds per N (default 15)")
    bs.add_argument("--quick", action="store_true", help="N = 1, 8, 3 rounds: a smoke test, not a measurement")
    bs.add_argument("--backend", choices=("cupy", "numpy"), help="the models' batch-invariant loss_and_grad "
                    "against the vendor route (cupy.matmul), a per-worker loop and one process, on CuPy (GPU) "
                    "or NumPy (tgsim.bench.sim_gpu)")
    bs.set_defaults(func=_cmd_bench_sim)
    from tgsim.bench import exchange  # light: numpy and pandas are imported when a sweep runs

    bx = bsub.add_parser("exchange", help="MPI exchange modes over an emulated 1/10 Gb/s network (needs root)")
    exchange.add_arguments(bx)
    bx.set_defaults(func=exchange.cmd)
    from tgsim.bench import torch_ddp  # light: torch, mpi4py and pandas are imported when the bench runs

    bt = bsub.add_parser("torch", help="tgsim's DDP comm hook against the backward pass and DDP's all-reduce "
                                       "and fp16 hooks, CPU, Gloo (shaped rates need root)")
    torch_ddp.add_arguments(bt)
    bt.set_defaults(func=torch_ddp.cmd)

    f = sub.add_parser("figures", help="run the figure scripts of the installed package (make_report.py, or "
                                       "the named ones); outputs in --out")
    f.add_argument("names", nargs="*", metavar="NAME", help="scripts to run, e.g. fig02 or "
                   "least_squares_robbins_monro (default: every figNN script and REPORT.md)")
    f.add_argument("--out", help="output folder (default $TGSIM_FIGURES_OUT, else ./tgsim-figures)")
    f.add_argument("--quick", action="store_true", help="each script's smoke-test form, into OUT/quick")
    f.add_argument("--quiet", action="store_true", help="no progress lines")
    f.add_argument("--list", action="store_true", help="list the scripts and stop")
    f.set_defaults(func=_cmd_figures)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # the reader of stdout went away (`tgsim ... | head`): stop quietly, as other Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
