"""Training with `run.backend = "cupy"` on a real GPU: issue 23's acceptance (marker `gpu`).

Skipped without a CUDA GPU and CuPy (the reason is in the report); `make test-gpu` runs them.
  * a GPU run is deterministic, and kill-and-resume gives the uninterrupted run's bits;
  * a checkpoint written on the GPU resumes on the CPU, and one written on the CPU on the GPU;
  * `mpiexec -n 2 python -m tgsim.mpi_runs.train` with the GPU backend equals the 2-worker GPU simulator
    bit for bit (every exchange mode, TernGrad and fp32): the models' fixed-order kernels make a
    worker's gradient the same alone (one rank) as in a batch (the simulator);
  * CPU and GPU agree: fp32 training, 20 steps from the same start, parameters within rtol 1e-3 and
    atol 1e-5 (the kernels sum in another order than the CPU's BLAS; nothing else differs);
  * the demo recipe (`tgsim run tgsim/configs/demo.toml --set run.backend=cupy`) reaches the CPU
    run's test accuracy within 1 point.
The same plumbing runs on the CPU through a stand-in CuPy in tests/test_gpu_backend.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from mpi_cases import config_dict, load_params, mpiexec, needs_mpi, params_bits, simulate, write_toml
from tgsim.backend import gpu_available
from tgsim.train import checkpoint
from tgsim.train.config import from_dict, load
from tgsim.train.loop import run

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU / CuPy: training on the GPU "
                                                              "backend is checked by `make test-gpu` on one")]

GPU = {"run": {"backend": "cupy", "checkpoint_every": 10, "steps": 30}}


def gpu_dict(model: str, mode: str, **sections) -> dict:
    d = config_dict(model, mode, **sections)
    for sec, values in GPU.items():
        d[sec] = {**d[sec], **values}
    return d


def bits(params: dict) -> dict:
    return params_bits({k: np.asarray(v.get() if hasattr(v, "get") else v) for k, v in params.items()})


def test_gpu_run_is_deterministic_and_resumes_bitwise(tmp_path):  # pragma: no cover - needs a GPU
    d = gpu_dict("mlp", "ps-mean")
    full = simulate(d, tmp_path / "full")
    again = simulate(d, tmp_path / "again")
    assert bits(full.params) == bits(again.params)
    (tmp_path / "full" / "checkpoints" / "ckpt-00000030.tgck").unlink()
    resumed = run(from_dict(d), out=tmp_path / "full", resume=True, quiet=True)
    assert resumed.start_step == 20 and bits(resumed.params) == bits(full.params)


@pytest.mark.parametrize("first, second", [("cupy", "numpy"), ("numpy", "cupy")])
def test_a_checkpoint_resumes_on_the_other_backend(tmp_path, first, second):  # pragma: no cover - needs a GPU
    d = gpu_dict("mlp", "ps-mean")
    d["run"] = {**d["run"], "backend": first, "steps": 10}
    run(from_dict(d), out=tmp_path / "r", quiet=True)
    state = checkpoint.read(checkpoint.list_checkpoints(tmp_path / "r" / "checkpoints")[-1])
    assert all(type(v) is np.ndarray for v in checkpoint.flatten(state).values())
    d["run"] = {**d["run"], "backend": second, "steps": 30}
    res = run(from_dict(d), out=tmp_path / "r", resume=True, quiet=True)
    assert res.start_step == 10 and np.isfinite(res.test_loss) and res.test_accuracy > 0.5


@needs_mpi
@pytest.mark.parametrize("model, mode", [("mlp", "ps-mean"), ("mlp", "allreduce-mean"), ("mlp", "allgather-none"),
                                         ("ls", "ps"), ("mlp", "fp32")])
def test_mpi_on_gpus_equals_the_gpu_simulator(tmp_path, model, mode):  # pragma: no cover - needs a GPU
    d = gpu_dict(model, mode, workers={"n": 2, "batch": 16})
    cfg = write_toml(d, tmp_path / "c.toml")
    res, _ = mpiexec([(2, ["-m", "tgsim.mpi_runs.train", str(cfg), "--out", str(tmp_path / "mpi"), "--quiet"])],
                     timeout=300)
    assert res.returncode == 0, res.report()
    sim = simulate(d, tmp_path / "sim")
    assert params_bits(load_params(tmp_path / "mpi" / "params.npz")) == bits(sim.params)


def test_cpu_and_gpu_agree_within_the_stated_tolerance(tmp_path):  # pragma: no cover - needs a GPU
    d = config_dict("mlp", "fp32")
    d["run"] = {**d["run"], "steps": 20}
    cpu = run(from_dict(d), out=tmp_path / "cpu", quiet=True)
    d["run"] = {**d["run"], "backend": "cupy"}
    gpu = run(from_dict(d), out=tmp_path / "gpu", quiet=True)
    for k, v in cpu.params.items():
        np.testing.assert_allclose(np.asarray(gpu.params[k].get()), v, rtol=1e-3, atol=1e-5, err_msg=k)


def test_demo_on_the_gpu_reaches_the_cpu_accuracy(tmp_path):  # pragma: no cover - needs a GPU
    cfg_path = "tgsim/configs/demo.toml"
    cpu = run(load(cfg_path), out=tmp_path / "cpu", quiet=True)
    gpu = run(load(cfg_path, ["run.backend=cupy"]), out=tmp_path / "gpu", quiet=True)
    assert abs(gpu.test_accuracy - cpu.test_accuracy) <= 0.01, (gpu.test_accuracy, cpu.test_accuracy)
