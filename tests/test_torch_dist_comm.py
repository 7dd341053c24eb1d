"""tgsim/torch/dist_comm.py: mpi4py's Comm calls over torch.distributed, and the DDP hook over the process
group DDP itself uses (`TgsimHookState.create(..., transport="torch")`).

One mpiexec job of 2 ranks (tests/torch_ddp_driver.py --transport torch, Gloo initialised from a
file store) runs: every TorchDistComm call MPIExchange makes against mpi4py's COMM_WORLD on the same
inputs, byte for byte (tests/dist_comm_cases.py: reductions of every dtype the exchange uses and of
those Gloo lacks, variable-size gathers with zero counts and gaps, point-to-point messages in
posting order, pickled objects); MPIExchange over either comm on the same messages (every mode and
transport: the same means and byte counts); the misuses that must name themselves; and DDP with the
hook over Gloo for TernGrad (shared scalers, allreduce and sharded_ps) and QSGD (parameter server),
which ends with the simulator's parameters after every step. Without MPI: the transport argument is checked, and a
1-rank Gloo group runs MPIExchange without touching mpi4py. On a GPU (`make test-gpu`): NCCL with
CuPy buffers. Skipped, with the reason, without torch (the mpiexec tests without MPI).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install tgsim[torch])")

from dist_comm_cases import CALLS, ERRORS, EXCHANGES  # noqa: E402
from mpi_cases import mpiexec, needs_mpi, simulate  # noqa: E402
from torch_ddp_cases import BUCKET_CAP_MB, CODECS, DRIVER, STEPS, check_bits, digest  # noqa: E402

from tgsim.errors import ConfigError  # noqa: E402
from tgsim.torch import ddp as tgddp  # noqa: E402
from tgsim.train import checkpoint  # noqa: E402

TRAIN = {name: {"config": CODECS[name], "steps": STEPS, "bucket_cap_mb": BUCKET_CAP_MB, "bucket_view": name == "qsgd"}
         for name in ("terngrad", "qsgd", "terngrad-sharded")}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The 2-rank job: the comm checks and the two training cases over --transport torch; the
    simulator's per-step digests and final parameters of each case."""
    tmp = tmp_path_factory.mktemp("dist_comm")
    (tmp / "cases.json").write_text(json.dumps({"train": TRAIN, "comm": True}))
    (tmp / "out").mkdir()
    res, _ = mpiexec([(2, [str(DRIVER), str(tmp / "cases.json"), str(tmp / "out"), "--transport", "torch"])],
                     timeout=300)
    assert res.returncode == 0, res.report()
    ranks = json.loads((tmp / "out" / "results.json").read_text())
    sim = {}
    for name, case in TRAIN.items():
        run = simulate(case["config"], tmp / "sim" / name)
        steps = [digest(checkpoint.read(p)["params"])
                 for p in checkpoint.list_checkpoints(tmp / "sim" / name / "checkpoints")]
        assert len(steps) == STEPS and steps[-1] == digest(run.params)
        sim[name] = (steps, run.params)
    return SimpleNamespace(ranks=ranks, sim=sim, out=tmp / "out")


@needs_mpi
@pytest.mark.parametrize("name", CALLS)
def test_each_call_gives_mpi4pys_bytes(job, name):
    """The call on TorchDistComm leaves, on both ranks, the bytes (and dtype, shape) mpi4py's
    COMM_WORLD leaves for the same inputs (objects: the same repr)."""
    assert len(job.ranks) == 2
    for r in job.ranks:
        assert r["comm"][name] == "ok", (r["rank"], r["comm"][name])


@needs_mpi
@pytest.mark.parametrize("name", EXCHANGES)
def test_mpi_exchange_over_torch_gives_mpi4pys_results(job, name):
    """MPIExchange over TorchDistComm returns, on both ranks, the means (bit for bit) and byte counts
    it returns over mpi4py for the same messages: control messages, scalers, the exact fp32 mean,
    TernGrad's integer all-reduce, all-gather and parameter server (in pieces, whole, collective),
    fp16 and signSGD's own messages."""
    for r in job.ranks:
        assert r["exchange"][name] == "ok", (r["rank"], r["exchange"][name])


@needs_mpi
def test_misuses_name_the_call(job):
    """A call the adapter lacks, a MAX it cannot do exactly, mpi4py's own datatype or op, a strided
    buffer: an error naming the call and what is wrong, on every rank."""
    assert set(ERRORS) == set(job.ranks[0]["comm"]["errors"])
    for r in job.ranks:
        e = r["comm"]["errors"]
        assert e["Split_type"].startswith("NotImplementedError: TorchDistComm.Split_type:"), e
        assert e["uint64-max"].startswith("TypeError: TorchDistComm.Allreduce: MAX of uint64"), e
        assert e["mpi4py-datatype"].startswith("TypeError: TorchDistComm.Allreduce:") and "datatype" in \
            e["mpi4py-datatype"], e
        assert e["mpi4py-op"].startswith("TypeError: TorchDistComm.Allreduce: op"), e
        assert e["noncontiguous"] == "ValueError: TorchDistComm.Bcast: the buffer is not C-contiguous", e


@needs_mpi
@pytest.mark.parametrize("name", list(TRAIN))
def test_ddp_hook_over_gloo_ends_with_the_simulators_bits(job, name):
    """DDP with the hook whose exchange runs over DDP's own Gloo group: after every one of 5 steps,
    on both ranks, the simulator's parameters (one bucket at step 0, two from DDP's rebuild on)."""
    assert [r["train"][name]["comm"] for r in job.ranks] == ["tgsim.torch.dist_comm"] * 2
    check_bits(job, name, 2)


@needs_mpi
@pytest.mark.heavy
def test_torchrun_without_mpi4py_ends_with_the_simulators_bits(job, tmp_path):
    """`torchrun --standalone --nproc-per-node 2`, mpi4py unimportable in the ranks: DDP with the hook
    over transport "torch" (TernGrad, shared scalers) has the simulator's parameters after every step
    on both ranks."""
    import os
    import shutil
    import subprocess
    import sys

    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this interpreter")
    (tmp_path / "case.json").write_text(json.dumps(TRAIN["terngrad"]))
    cases = Path(__file__).resolve().parent / "dist_comm_cases.py"
    res = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", str(cases), str(tmp_path / "case.json")],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"})
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert sorted(x["rank"] for x in lines) == [0, 1]
    assert all(x["digests"] == job.sim["terngrad"][0] for x in lines), lines


# -- without MPI -----------------------------------------------------------------------------------------------

def test_transport_is_checked_and_needs_a_process_group(monkeypatch):
    """An unknown transport is a ConfigError; the torch transport before init_process_group a
    RuntimeError saying so."""
    import torch.distributed as dist

    from tgsim.torch.dist_comm import TorchDistComm

    module = torch.nn.Linear(3, 2)
    with pytest.raises(ConfigError, match=r"transport must be one of \('mpi', 'torch'\), got 'nccl'"):
        tgddp.TgsimHookState.create(module, {"workers": {"n": 1, "batch": 4}}, transport="nccl")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match="init_process_group first"):
        TorchDistComm()


def test_one_rank_gloo_group_runs_the_exchange_without_mpi4py(tmp_path, monkeypatch):
    """A 1-rank Gloo group in this process: MPIExchange over TorchDistComm (torch_exchange) never
    asks for mpi4py (mpi_module raises), takes the comm's constants, no device; the fp32 mean of one
    worker is its gradient, and the hook's create runs its parameter check over the comm."""
    import torch.distributed as dist

    import tgsim.exchange.mpi as mpi_mod
    import tgsim.exchange.mpi_transport as mt

    def no_mpi4py():
        raise AssertionError("mpi4py was asked for")

    monkeypatch.setattr(mpi_mod, "mpi_module", no_mpi4py)
    monkeypatch.setattr(mt, "mpi_module", no_mpi4py)
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ex = tgddp.torch_exchange(bucket_bytes=8)
        assert ex.MPI is ex.comm.MPI and (ex.rank, ex.size, ex.device, ex.cuda_aware) == (0, 1, None, False)
        g = {"w": np.arange(5, dtype=np.float32) / 7}
        mean, _ = ex.mean_fp32([g])
        assert mean["w"].tobytes() == g["w"].tobytes()
        state = tgddp.TgsimHookState.create(torch.nn.Linear(3, 2), {"workers": {"n": 1, "batch": 4}},
                                            transport="torch")
        assert type(state.exchange.comm).__name__ == "TorchDistComm"
    finally:
        dist.destroy_process_group()


# -- on a GPU ----------------------------------------------------------------------------------------------------

def _nccl_ready() -> str | None:
    from tgsim.backend import gpu_available

    if not torch.cuda.is_available() or not gpu_available():
        return "no CUDA GPU / CuPy: the NCCL path is checked by `make test-gpu` on one"
    if not torch.distributed.is_nccl_available():
        return "this torch build has no NCCL"
    return None


@pytest.mark.gpu
@pytest.mark.skipif(_nccl_ready() is not None, reason=str(_nccl_ready()))
def test_nccl_with_cupy_buffers(tmp_path):
    """min(2, GPUs) ranks over NCCL, one GPU each, spawned here: every call on CuPy buffers (DLPack,
    torch's stream) gives what NumPy computes from all ranks' inputs (int16 sums widened, the padded
    Allgatherv), host buffers go over the comm's Gloo group, and MPIExchange's TernGrad all-reduce of
    device messages gives InProcessExchange's bits."""
    import torch.multiprocessing as mp

    from dist_comm_cases import device_worker

    world = min(2, torch.cuda.device_count())
    mp.spawn(device_worker, args=(world, str(tmp_path / "store"), str(tmp_path)), nprocs=world)
    for r in range(world):
        res = json.loads((tmp_path / f"device-{r}.json").read_text())
        assert "error" not in res, res
        bad = {k: v for k, v in res.items() if v != "ok"}
        assert not bad and len(res) >= 11, (r, bad)


@needs_mpi
def test_the_gpu_checks_pass_on_numpy_buffers_over_gloo(job):
    """The GPU test's checks (device_checks) on NumPy buffers in the 2-rank job: every call gives what
    NumPy computes from both ranks' inputs, and MPIExchange's TernGrad all-reduce the in-process bits."""
    for r in job.ranks:
        res = r["device"]
        assert "error" not in res and all(v == "ok" for v in res.values()) and len(res) >= 11, res
