"""Command line: `tgsim demo | bench codec` (run, analyze and figures arrive with their issues)."""

from __future__ import annotations

import argparse
import sys


def _cmd_demo(args) -> int:
    from tgsim import demo

    demo.run(workers=args.workers, seed=args.seed)
    return 0


def _cmd_bench(args) -> int:
    if args.what == "codec":
        from tgsim import bench_codec

        rows = bench_codec.run(n_elements=args.elements, workers=args.workers, repeats=args.repeats)
        bench_codec.print_table(rows)
        return 0
    raise SystemExit(f"unknown benchmark {args.what!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tgsim", description="TernGrad and its peers: codec, simulator, analysis.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="encode one step of real gradients with TernGrad and print the statistics")
    d.add_argument("--workers", type=int, default=4)
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=_cmd_demo)

    b = sub.add_parser("bench", help="benchmarks that print ratios measured in one run")
    b.add_argument("what", choices=["codec"])
    b.add_argument("--elements", type=int, default=16_777_216, help="gradient size (default 64 MiB of float32)")
    b.add_argument("--workers", type=int, default=8, help="payloads summed in the decode benchmark")
    b.add_argument("--repeats", type=int, default=5)
    b.set_defaults(func=_cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
