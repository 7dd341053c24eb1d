"""What every rank of tests/test_torch_zoo.py's jobs runs: the zoo's cases (tests/torch_zoo.py) trained by
DDP with tgsim's hook, and (under mpiexec) by tgsim's MPI trainer, results in OUT/rank-R.json.

    mpiexec -n N python tests/torch_zoo_driver.py OUT [CASE ...]
    torchrun --standalone --nproc-per-node N tests/torch_zoo_driver.py OUT --transport torch [CASE ...]

Nothing is set but what the README tells a user to set (`torch.set_num_threads(1)`). Per case and
rank (N workers, one per rank: tests/torch_zoo.py `case_config`): the sha256 of the trainable parameters after every step through the hook (transport "mpi"
over mpi4py's COMM_WORLD, or "torch" over the Gloo group torchrun starts), or the hook's error (a
refused model: its one line, and whether the parameters stayed as built); under mpiexec also the
final parameters of `python -m tgsim.mpi_runs.train`'s run of the same config (OUT/CASE-mpi/).
Each rank trains worker `rank` of the simulator: the module a user builds (the factory called after
`torch.manual_seed(seed)`), the simulator's batches of that worker (`tgsim.data.batch_indices`).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import torch_zoo  # noqa: E402
from torch_zoo import ZOO, case_config  # noqa: E402

from tgsim.data import batch_indices  # noqa: E402
from tgsim.torch import ddp as tgddp  # noqa: E402
from tgsim.train.config import from_dict  # noqa: E402
from tgsim.train.loop import build  # noqa: E402


def hook_case(name: str, rank: int, transport: str, workers: int) -> dict:
    d, why = case_config(name, workers), ZOO[name][1]
    cfg = from_dict(d)
    setup = build(cfg)
    torch.manual_seed(cfg.run.seed)              # the module as a user builds it: their factory, the run's seed
    factory = getattr(torch_zoo, d["model"]["options"]["factory"].split(":")[1])
    module = factory(dim=int(np.prod(setup.dataset.feature_shape)), classes=setup.dataset.n_classes)
    before = tgddp.digest(module) if why else None
    digests, error = [], None
    try:
        state = tgddp.TgsimHookState.create(module, d, transport=transport)
        model = DDP(module, find_unused_parameters=name == "unused")
        tgddp.register(model, state)
        opt = tgddp.TgsimOptimizer(state)
        b = cfg.workers.per_worker_batch
        for step in range(cfg.run.steps):
            idx = batch_indices(setup.shards[rank], b, cfg.run.seed, step, rank)
            x = torch.from_numpy(setup.dataset.x_train[idx])
            y = torch.from_numpy(setup.dataset.y_train[idx])
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            digests.append(tgddp.digest(module))
    except Exception as e:  # noqa: BLE001  (a refused model's error is the result)
        error = f"{type(e).__name__}: {e}"
    return {"digests": digests, "error": error, "threads": torch.get_num_threads(),
            "unchanged": None if before is None else tgddp.digest(module) == before}


def mpi_trainer_case(name: str, out: Path, workers: int) -> None:
    """`python -m tgsim.mpi_runs.train CONFIG --out OUT/NAME-mpi` in this process (every rank)."""
    from mpi_cases import write_toml

    from tgsim.mpi_runs.train import main as mpi_train

    cfg_path = write_toml(case_config(name, workers), out / f"{name}.toml")
    code = mpi_train([str(cfg_path), "--out", str(out / f"{name}-mpi"), "--quiet"])
    if code != 0:
        raise RuntimeError(f"{name}: the MPI trainer exited {code}")


def main() -> None:
    args = sys.argv[1:]
    out = Path(args.pop(0))
    transport = "mpi"
    if args[:2] == ["--transport", "torch"]:
        transport, args = "torch", args[2:]
    names = args or list(ZOO)
    torch.set_num_threads(1)                     # the README's one setting
    if transport == "mpi":
        from mpi4py import MPI

        rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        dist.init_process_group("gloo", init_method=f"file://{out / 'store'}", rank=rank, world_size=size)
    else:
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
    res = {"rank": rank, "transport": transport, "hook": {}}
    for name in names:
        res["hook"][name] = hook_case(name, rank, transport, size)
    if transport == "mpi":
        for name in names:
            if ZOO[name][1] is None:
                mpi_trainer_case(name, out, size)
    (out / f"{transport}-rank-{rank}.json").write_text(json.dumps(res))
    import gc

    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        if "--transport" not in sys.argv:
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(1)
        os._exit(1)
