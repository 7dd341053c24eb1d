"""`tgsim compare variance | speedup | bits | time`: the reviewers' questions at equal communication.

    tgsim compare variance [--quick] [--out DIR] [--seed S] [--R R] [--n N] [--codecs a,b] [--kinds a,b]
    tgsim compare speedup  [--quick] [--out DIR] [--seeds K] [--workers 1,2,..] [--methods a,b] [--lr-grid a,b]
                           [--tune-steps T] [--jobs J]
    tgsim compare bits     [--quick] [--out DIR] [--seeds K] [--steps S] [--problems a,b] [--methods a,b]
                           [--lr-grid a,b] [--workers 4,8] [--jobs J]
    tgsim compare time     [--quick] [--out DIR] [--bits DIR] [--allow-quick] [--problem P] [--nets a,b]
                           [--workers 8,16,..] [--codec-cost gpu|host|none] [--hardware a,b] [--bucket-mb MB]
                           [--dedicated-servers M] [--scaling weak|strong] [--net-file JSON ...]

Each writes a tidy CSV and a seaborn figure to --out (default results/compare-<what>) and prints a short
summary and the paths. --quick runs the same code on small parameters (a smoke test for CI, numbers not
for reporting; compare bits marks its rows `quick`, and `compare time` refuses them with exit status 2
unless --allow-quick, then marks its own output QUICK); an option given on the command line wins over
its --quick value. Heavy imports happen
only when a command runs (tgsim.analysis.compare_variance, tgsim.analysis.compare_speedup,
tgsim.analysis.compare_bits, tgsim.analysis.compare_time).
"""

from __future__ import annotations

import argparse
import sys

# option dest -> (full default, --quick value); None: the module's own default
VARIANCE = {"R": (30, 10), "n": (1 << 15, 1 << 14), "seed": (0, 0), "recorded_steps": (50, 3),
            "kinds": ("gaussian,student_t2,lognormal,sparse,mnist1d", "gaussian,mnist1d"), "codecs": ("", "")}
SPEEDUP = {"seeds": (3, 3), "workers": ("1,2,4,8,16,32,64", "1,2,4,8"),
           "methods": ("", "quick"),
           "fixed_m": (16, 4), "lr_grid": ("0.0625,0.125,0.25,0.5", "0.25,0.5"), "tune_steps": (300, 100),
           "jobs": (0, 1)}
# --quick's problem and sweep (tgsim.analysis.compare_speedup.Problem keywords; K M b <= n holds)
SPEEDUP_QUICK_PROBLEM = dict(n=32768, noise=5.5, batch=32, eps=0.05)
# --quick sweeps the first registered codec with a numeric knob at two of its values: the first and the middle one
BITS = {"seeds": (3, 1), "steps": (0, 0), "problems": ("logistic,convnet", "logistic,convnet"),
        "methods": ("", "quick"), "lr_grid": ("0.025,0.05,0.1,0.2", "0.05,0.1"), "jobs": (0, 1)}
BITS_QUICK_STEPS = {"logistic": 100, "convnet": 30, "resnet": 24, "transformer": 20}  # --quick's steps per problem


def _resolve(args, table: dict) -> None:
    for dest, (full, quick) in table.items():
        if getattr(args, dest) is None:
            setattr(args, dest, quick if args.quick else full)


def _jobs(j: int) -> int:
    """--jobs 0: one process per core."""
    import os

    return j if j > 0 else max(1, os.cpu_count() or 1)


def _list(text: str, cast=str) -> tuple:
    return tuple(cast(x.strip()) for x in str(text).split(",") if x.strip())


def _methods(text: str) -> tuple | None:
    """Method labels (tgsim.analysis.common.split_label) from a comma-separated list; "" -> None (every
    registered codec: common.default_methods); "quick" -> common.quick_methods()."""
    from tgsim.analysis.common import quick_methods, split_list

    if text == "quick":
        return quick_methods()
    return split_list(text) or None


def _quick_sweeps() -> dict:
    """--quick's compression sweep: the first registered codec with a numeric sweep knob, at its first
    and middle values (tgsim.analysis.compare_speedup.default_sweeps)."""
    from tgsim.analysis.compare_speedup import default_sweeps
    from tgsim.codecs import registry

    for method, (key, values) in default_sweeps(registry.names()).items():
        return {method: (key, tuple(dict.fromkeys((values[0], values[len(values) // 2]))))}
    return {}


def _variance(args) -> int:
    from tgsim.analysis import compare_variance as cv

    _resolve(args, VARIANCE)
    codecs = _methods(args.codecs) or cv.default_codecs()
    for c in codecs:                # registered codecs (plugins included) and their options
        try:
            cv.spec(c)
        except ValueError as e:
            raise SystemExit(f"tgsim compare variance: {e}") from None
    cv.run(args.out, codecs=codecs, kinds=_list(args.kinds), n=args.n, R=args.R, seed=args.seed,
           recorded_steps=args.recorded_steps)
    return 0


def _speedup(args) -> int:
    from tgsim.analysis import compare_speedup as cs

    _resolve(args, SPEEDUP)
    methods = _methods(args.methods) or cs.default_methods()
    for m in methods:               # registered codecs, plugins included ("+ef": error feedback)
        try:
            cs.method_sections(m)
        except ValueError as e:
            raise SystemExit(f"tgsim compare speedup: {e}") from None
    extra = dict(problem=cs.Problem(**SPEEDUP_QUICK_PROBLEM), sweeps=_quick_sweeps()) if args.quick else {}
    cs.run(args.out, workers=_list(args.workers, int), methods=methods, seeds=tuple(range(args.seeds)),
           fixed_M=args.fixed_m or None, lr_grid=_list(args.lr_grid, float), tune_steps=args.tune_steps,
           jobs=_jobs(args.jobs), **extra)
    return 0


def _bits(args) -> int:
    import dataclasses

    from tgsim.analysis import compare_bits as cb

    _resolve(args, BITS)
    methods = _methods(args.methods) or cb.default_methods()
    names = _list(args.problems)
    for m in methods:               # registered codecs, plugins included ("+ef": error feedback)
        try:
            cb.method_sections(m)
        except ValueError as e:
            raise SystemExit(f"tgsim compare bits: {e}") from None
    unknown = [p for p in names if p not in cb.ALL_PROBLEMS]
    if unknown:
        raise SystemExit(f"tgsim compare bits: unknown problem(s) {unknown}; valid: {', '.join(cb.ALL_PROBLEMS)}")
    try:
        workers = _list(args.workers or "", int)
    except ValueError:
        raise SystemExit(f"tgsim compare bits: --workers must be comma-separated integers, got {args.workers!r}") \
            from None
    problems = []
    for name in names:
        steps = args.steps or (BITS_QUICK_STEPS[name] if args.quick else 0)
        p = cb.ALL_PROBLEMS[name]
        p = dataclasses.replace(p, steps=steps) if steps else p
        if args.quick and len(p.lr_grid) > 2:       # --quick: the two middle rates of a problem's own grid,
            keep = 1 if p.model == "torch" else 2   # the lower one for a torch model's (its runs cost most)
            p = dataclasses.replace(p, lr_grid=tuple(p.lr_grid)[(len(p.lr_grid) - 1) // 2:][:keep])
        try:
            problems.extend(cb.at_workers(p, n) for n in workers) if workers else problems.append(p)
        except ValueError as e:
            raise SystemExit(f"tgsim compare bits: {e}") from None
    cb.run(args.out, problems=problems, methods=methods, seeds=tuple(range(args.seeds)),
           lr_grid=_list(args.lr_grid, float), jobs=_jobs(args.jobs), quick=args.quick)
    return 0


TIME = {"nets": ("alexnet,vgg_a,googlenet,resnet50", "alexnet,resnet50"), "workers": ("8,16,32,64,128,256,512", "8,64,512"),
        "n_wire": (1 << 15, 1 << 12), "n_cost": (1 << 20, 1 << 16)}


def _time(args) -> int:
    from tgsim.analysis import compare_time as ct

    _resolve(args, TIME)
    bits = args.bits or ("results/compare-bits" if not args.quick else f"{args.out}/bits-quick")
    try:
        ct.run(args.out, bits=bits, bits_quick=args.quick, problem=args.problem, nets=_list(args.nets),
               workers=_list(args.workers, int), codec_cost=args.codec_cost, n_wire=args.n_wire,
               n_cost=args.n_cost, jobs=_jobs(0) if not args.quick else 1, allow_quick=args.allow_quick,
               hardware=tuple(_list(args.hardware)), bucket_mb=args.bucket_mb, dedicated_servers=args.dedicated_servers,
               scaling=args.scaling, net_files=tuple(args.net_file or ()))
    except ValueError as e:
        print(f"tgsim compare time: {e}", file=sys.stderr)
        return 2
    except (ct.QuickInputError, ct.MissingBaselineError) as e:
        print(f"tgsim compare time: {e}", file=sys.stderr)
        return 2
    return 0


def _help(table: dict, dest: str) -> str:
    full, quick = table[dest]
    if quick == "quick":        # tgsim.analysis.common.quick_methods
        quick = "the baseline, the default codec and one error-feedback codec"
    def word(v):
        return "every registered codec" if v == "" else v if v else "all"

    return f"(default {word(full)}; --quick {word(quick)})"


def register(sub) -> None:
    """Add `compare` with `variance`, `speedup`, `bits` and `time` to the top-level sub-parser action `sub`."""
    c = sub.add_parser("compare", help="codecs at equal communication: variance at equal bits, speedup in workers "
                                       "(CSV + figure)")
    csub = c.add_subparsers(dest="what", required=True)

    v = csub.add_parser("variance", help="MSE of the N-worker mean at 1..16 bits per element (measured payloads) "
                                         "against the exact formulas")
    v.add_argument("--out", default="results/compare-variance", help="directory (default %(default)s)")
    v.add_argument("--quick", action="store_true", help="2 vector kinds, 2^14 elements, R = 10: a smoke test")
    v.add_argument("--seed", type=int, default=None, help=_help(VARIANCE, "seed"))
    v.add_argument("--R", type=int, default=None, help="rounds of 32 workers' encodings " + _help(VARIANCE, "R"))
    v.add_argument("--n", type=int, default=None, help="synthetic vector size " + _help(VARIANCE, "n"))
    v.add_argument("--kinds", default=None, help="comma-separated vector kinds " + _help(VARIANCE, "kinds"))
    v.add_argument("--codecs", default=None, help="comma-separated codec labels NAME[key=value;...] "
                   "(default: every registered codec at its defaults, its declared knobs searched)")
    v.add_argument("--recorded-steps", type=int, default=None,
                   help="fp32 steps of the MNIST-1D convnet before its gradients are taken " +
                        _help(VARIANCE, "recorded_steps"))
    v.set_defaults(func=_variance)

    s = csub.add_parser("speedup", help="iterations to a fixed distance to w* against workers M and against the "
                                        "compression ratio (least squares)")
    s.add_argument("--out", default="results/compare-speedup", help="directory (default %(default)s)")
    s.add_argument("--quick", action="store_true", help="M = 1..8, 3 methods, a smaller problem: a smoke test")
    s.add_argument("--seeds", type=int, default=None, help="seeds 0..K-1 " + _help(SPEEDUP, "seeds"))
    s.add_argument("--workers", default=None, help="comma-separated M " + _help(SPEEDUP, "workers"))
    s.add_argument("--methods", default=None, help="comma-separated methods " + _help(SPEEDUP, "methods"))
    s.add_argument("--fixed-m", type=int, default=None, help="M of the compression sweep, 0: none " +
                   _help(SPEEDUP, "fixed_m"))
    s.add_argument("--lr-grid", default=None, help="comma-separated γ0 tuned on a validation split (fp32's best for "
                   "every method, and each method's own, side by side; empty: γ0 0.25, no tuning) "
                   + _help(SPEEDUP, "lr_grid"))
    s.add_argument("--tune-steps", type=int, default=None, help="iterations of each tuning run " +
                   _help(SPEEDUP, "tune_steps"))
    s.add_argument("--jobs", type=int, default=None, help="processes, 0: one per core " + _help(SPEEDUP, "jobs"))
    s.set_defaults(func=_speedup)

    b = csub.add_parser("bits", help="uplink + downlink bits until the training loss reaches 1.25 x fp32's "
                                     "minimum, and the accuracy then (logistic regression, MNIST-1D convnet)")
    b.add_argument("--out", default="results/compare-bits", help="directory (default %(default)s)")
    b.add_argument("--quick", action="store_true", help="1 seed, 3 methods, 100 / 30 steps: a smoke test")
    b.add_argument("--seeds", type=int, default=None, help="seeds 0..K-1 " + _help(BITS, "seeds"))
    b.add_argument("--steps", type=int, default=None, help="steps per run, every problem, 0: the problem's own "
                   "(logistic 600, convnet 800, resnet 300, transformer 400; others capped at 2 x; --quick 100, "
                   "30, 24, 20)")
    b.add_argument("--problems", default=None, help="comma-separated problems, also resnet and transformer "
                   "(torch models; own grid of the transformer: compare_bits.ADAM_GRID; --quick: the lower of a torch "
                   "model's 2 middle rates, a NumPy model's 2 middle rates) "
                   + _help(BITS, "problems"))
    b.add_argument("--methods", default=None, help="comma-separated methods " + _help(BITS, "methods"))
    b.add_argument("--lr-grid", default=None, help="comma-separated learning rates tuned on a validation split "
                   "(fp32's best for every method, and each method's own, side by side; empty: lr 0.1, no tuning) "
                   + _help(BITS, "lr_grid"))
    b.add_argument("--workers", default=None, help="comma-separated worker counts: every problem at each, named "
                   "NAME-nN, its rates tuned per count (default: each problem's own, 8; resnet, transformer 4)")
    b.add_argument("--jobs", type=int, default=None, help="processes, 0: one per core " + _help(BITS, "jobs"))
    b.set_defaults(func=_bits)

    t = csub.add_parser("time", help="time to the loss target (steps from compare bits x modeled step time with "
                                     "measured payloads and codec seconds) on 1/10/100 Gb/s, N = 8..512")
    t.add_argument("--out", default="results/compare-time", help="directory (default %(default)s)")
    t.add_argument("--quick", action="store_true", help="2 nets, N = 8, 64, 512, small layers; runs compare bits "
                   "--quick into OUT/bits-quick unless --bits is given: a smoke test")
    t.add_argument("--bits", default=None, help="directory of compare bits' bits_runs.csv (default "
                   "results/compare-bits; run there first when missing)")
    t.add_argument("--allow-quick", action="store_true", help="use a bits_runs.csv written by compare bits --quick "
                   "(refused otherwise, exit 2); the output then says QUICK in its tables, CSVs and title")
    t.add_argument("--problem", default="convnet", help="the compare bits problem whose steps are used "
                   "(default %(default)s)")
    t.add_argument("--nets", default=None, help="comma-separated perf-model nets " + _help(TIME, "nets"))
    t.add_argument("--workers", default=None, help="comma-separated N " + _help(TIME, "workers"))
    t.add_argument("--codec-cost", default="gpu", choices=("gpu", "host", "none"),
                   help="codec seconds: a GPU measurement where that codec has one (TernGrad), else its own host "
                        "measurement, labelled (gpu); every codec's host measurement (host); none (default %(default)s)")
    t.add_argument("--hardware", default="p100-fp32,h100-amp", help="comma-separated hardware rows "
                   "(perfmodel_ddp.HARDWARE, or host-cpu for a net file's measured time; default %(default)s)")
    t.add_argument("--net-file", action="append", default=None, metavar="JSON",
                   help="a net described by a JSON file (perfmodel_nets.net_from_file: layer shapes and measured "
                        "forward + backward seconds); repeat for more; --nets '' leaves only these")
    t.add_argument("--bucket-mb", type=float, default=25.0, help="MiB of float32 gradient per DDP bucket, 0: one "
                   "per layer (default %(default)s)")
    t.add_argument("--dedicated-servers", type=int, default=0, help="parameter-server shards on servers of their "
                   "own (their NICs charged); 0: `ps` is rank 0's server (the code's ps mode); the server sharded "
                   "over the workers is always evaluated as `sharded_ps` (default %(default)s)")
    t.add_argument("--scaling", default="weak", choices=("weak", "strong"), help="weak: per-GPU batch fixed; "
                   "strong: the total batch at N = 8 fixed (default %(default)s)")
    t.set_defaults(func=_time, n_wire=None, n_cost=None)


def main(argv=None) -> int:  # pragma: no cover - convenience: python -m tgsim.analysis.compare_cli
    p = argparse.ArgumentParser(prog="tgsim")
    register(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return args.func(args)
