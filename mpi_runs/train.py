"""Train one config with one worker per MPI rank (the simulator's bits, on a real wire).

    mpiexec -n N python -m tgsim.mpi_runs.train CONFIG.toml [--out DIR] [--resume] [--set section.key=value]
    srun python -m tgsim.mpi_runs.train CONFIG.toml --out DIR          # one task per GPU; see slurm_job.sh
    mpiexec -n N python -m tgsim.mpi_runs.train --resume --out DIR     # continue from DIR's newest checkpoint
    mpiexec -n N python -m tgsim.mpi_runs.train CONFIG.toml --tensorboard DIR   # rank 0 writes event files too

[workers] n of the config must equal the number of ranks. Rank 0 writes the results directory
(config.toml, manifest.json, metrics.csv with rank 0's bytes, checkpoints/, params.npz, and
comm_bytes_by_rank.json with every rank's totals); every rank must see DIR for --resume.

Before rank 0 creates anything, every rank checks the model (tgsim.train.loop.preflight: init and
one forward and backward pass on worker 0's first batch) and, with --resume, the config against the
run's config.toml (--allow-change KEY accepts a change, as `tgsim run`).

Failures never leave ranks waiting: an error raised on every rank alike (a bad config or model, ranks
with different configs, a malformed payload, a non-finite gradient under run.on_nonfinite = "raise",
the steps before it checkpointed) is printed by every rank and the job exits with status 2 (bad input)
or 1; a run that ends unhealthy (too many skipped steps, a non-finite final loss) exits 3 on every rank; an error on some ranks only is printed and the job is aborted (MPI_Abort) after
TGSIM_MPI_ERROR_GRACE seconds (default 5; 30 for errors known to reach every rank).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mpiexec -n N python -m tgsim.mpi_runs.train",
                                description="Train with one TernGrad worker per MPI rank.")
    p.add_argument("config", nargs="?", help="CONFIG.toml (omit with --resume --out DIR)")
    p.add_argument("--out", help="results directory (default results/<name>-<time>, chosen by rank 0)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its newest good checkpoint")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value")
    p.add_argument("--quiet", action="store_true", help="no progress bar or progress lines (shown by rank 0 only)")
    p.add_argument("--allow-change", action="append", default=[], metavar="SECTION.KEY",
                   help="with --resume: accept this key's change against the run's config.toml (as tgsim run)")
    p.add_argument("--results", default="results", help="where a default results directory goes")
    p.add_argument("--tensorboard", metavar="DIR", help="rank 0 also writes metrics.csv's scalars as TensorBoard "
                   "event files into DIR (tgsim.train.tensorboard)")
    p.add_argument("--native-fp32", action="store_true",
                   help="BENCHMARK ONLY: MPI's own Allreduce for fp32 (fast, but not the simulator's bits)")
    p.add_argument("--bucket-mb", type=float, default=64.0, help="largest message per exchange phase (MiB)")
    return p


def load_config(args):
    from tgsim.train import config as config_mod
    from tgsim.errors import ConfigError

    if args.config is None:
        if not (args.resume and args.out):
            raise ConfigError("tgsim.mpi_runs.train needs a CONFIG.toml (or --resume --out DIR)")
        return config_mod.load(Path(args.out) / "config.toml", args.set)
    return config_mod.load(args.config, args.set)


def per_worker_bits(totals: list[dict], mode: str, start_step: int = 0) -> str:
    """The summary's bits, comparable with the simulator's bits per worker: the mean over the worker
    ranks of each rank's counted bytes x 8. In ps mode rank 0 is also the parameter server (it sends
    the downlink to every other rank), so the workers are ranks 1..N-1 and the server is reported on
    its own. MPI's counts include the 8-byte status word that leads every slot and downlink (the
    simulator counts payloads only). Counts start at `start_step` for a resumed run (this process's
    exchange)."""
    workers = totals[1:] if mode == "ps" and len(totals) > 1 else totals
    up = 8 * sum(t["sent"] for t in workers) / len(workers)
    down = 8 * sum(t["received"] for t in workers) / len(workers)
    text = f"bits/worker up {up:.3e} down {down:.3e}"
    if len(workers) < len(totals):
        text += f" (ranks 1..{len(totals) - 1}; rank 0 as server up {8 * totals[0]['sent']:.3e} " \
                f"down {8 * totals[0]['received']:.3e})"
    if start_step:
        text += f" since the resume at step {start_step}"
    return text


def _say(line: str) -> None:
    """One line to stderr in a single write, so mpiexec does not interleave it with other ranks'."""
    sys.stderr.flush()
    os.write(2, (line.replace("\n", " ") + "\n").encode())


def _fail(e: BaseException, comm, err_comm, rank: int) -> int:
    """Print `e` with the rank; exit together if every rank failed, else abort the job."""
    from tgsim.errors import CollectiveError, ConfigError, is_nonfinite

    collective = isinstance(e, CollectiveError)
    _say(f"[rank {rank}] {type(e).__name__}: {e}")
    bad_input = isinstance(e, (ConfigError, FileExistsError)) or is_nonfinite(e)
    if not isinstance(e, CollectiveError) and not bad_input:
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
    code = 2 if bad_input else 1
    grace = float(os.environ.get("TGSIM_MPI_ERROR_GRACE", "30" if collective else "5"))
    req = err_comm.Ibarrier()        # completes only if every rank failed too
    deadline = time.monotonic() + grace
    while not req.Test():
        if time.monotonic() > deadline:
            _say(f"[rank {rank}] the other ranks did not stop within {grace:g} s; aborting the job")
            time.sleep(0.5)          # MPI_Abort tears the job down at once: let mpiexec forward the line
            comm.Abort(code)
        time.sleep(0.005)
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from tgsim.exchange.mpi_env import mpi_or_exit

    MPI = mpi_or_exit("tgsim.mpi_runs.train")     # one line naming the fix: no mpi4py, mixed MPIs, no mpiexec
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    err_comm = comm.Dup()            # the failure handshake never mixes with the exchange's collectives
    try:
        from tgsim.exchange.mpi import MPIExchange
        from tgsim.train import results
        from tgsim.train.loop import run

        cfg = load_config(args)
        ex = MPIExchange(comm, exact=not args.native_fp32, bucket_bytes=int(args.bucket_mb * 2**20))
        out = args.out
        if out is None:
            out = comm.bcast(str(results.new_run_dir(args.results, cfg.run.name)) if rank == 0 else None, root=0)
        res = run(cfg, out=out, resume=args.resume, quiet=args.quiet or rank != 0, exchange=ex,
                  writer=rank == 0, results_base=args.results, allow_changes=args.allow_change,
                  tensorboard=args.tensorboard)
        totals = ex.gather_totals()
        if rank == 0:
            tmp = Path(out) / "comm_bytes_by_rank.tmp"
            tmp.write_text(json.dumps(totals, indent=2))
            os.replace(tmp, Path(out) / "comm_bytes_by_rank.json")
            if args.resume and res.start_step >= res.steps:
                print(f"the run in {out} was already complete ({res.steps} steps): nothing to do")
            print(f"test loss {res.test_loss:.4f}  accuracy {res.test_accuracy:.4f}  "
                  f"{per_worker_bits(totals, cfg.exchange.mode, res.start_step)}  skipped steps {res.skipped}  "
                  f"({ex.size} ranks)")
            print(f"results: {out}", flush=True)
            if res.unhealthy:
                _say(f"tgsim.mpi_runs.train: unhealthy run: {res.unhealthy} (`tgsim analyze run-health {out}`)")
        return res.exit_status        # the same on every rank: 3 when unhealthy
    except Exception as e:  # noqa: BLE001  (every failure must end the job, not leave ranks waiting)
        return _fail(e, comm, err_comm, rank)


if __name__ == "__main__":
    sys.exit(main())
