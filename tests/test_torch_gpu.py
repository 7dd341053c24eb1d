"""TorchModel on a real GPU (`run.backend = "cupy"`, marker `gpu`; `make test-gpu` runs them).

Skipped without a CUDA GPU, CuPy and a CUDA build of torch (the reason is in the report). Checked:
  * DLPack without copies: a CuPy array and the torch tensor TorchModel makes of it share memory;
  * batch invariance on the GPU: worker i's gradient in a call over N = 3 workers equals, bit for bit,
    a call with worker i alone (the ResNet and the transformer examples), so an MPI rank on the same
    GPU type computes the simulator's bits;
  * the GPU and CPU gradients agree within rtol 1e-3, atol 1e-5 (other kernels, other summation order);
  * the deterministic settings are on inside a call and restored after it;
  * `tgsim run torch_digits --set run.backend=cupy` reaches the CPU run's test accuracy within 3
    points (about 11 of the 360 test images: the runs differ in the last bits from step 0 on);
  * `mpiexec -n 2` on the GPU backend equals the 2-worker GPU simulator bit for bit (TernGrad ps);
  * DDP with tgsim's hook on the GPU ends with the GPU simulator's parameters bit for bit (TernGrad,
    integer all-reduce): over NCCL with the hook's exchange on DDP's own process group (transport
    "torch", one rank: NCCL refuses two ranks on one GPU), and on 2 ranks (Gloo for DDP's start-up,
    the hook's exchange over mpi4py with CuPy buffers); the NCCL transport's own calls are checked
    in tests/test_torch_dist_comm.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import json
from pathlib import Path

from mpi_cases import load_params, mpiexec, needs_mpi, params_bits, simulate
from torch_ddp_cases import BUCKET_CAP_MB, STEPS, ddp_config
from tgsim.backend import gpu_available

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install tgsim[torch])")


def _cuda_torch() -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:                               # pragma: no cover - a broken CUDA install
        return False


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (gpu_available() and _cuda_torch()),
                                 reason="no CUDA GPU with CuPy and a CUDA build of torch: the torch GPU path is "
                                        "checked by `make test-gpu` on one")]

MODELS = {"resnet": ("tgsim.torch.examples:resnet", {"dim": 64, "classes": 10, "kwargs": {"width": 8, "blocks": 1}}),
          "transformer": ("tgsim.torch.examples:char_transformer",
                          {"dim": 16, "classes": 40, "kwargs": {"d_model": 32, "heads": 2, "layers": 1}})}


def _model(name):
    from tgsim.torch import TorchModel

    factory, kw = MODELS[name]
    return TorchModel(factory=factory, dim=kw["dim"], classes=kw["classes"], kwargs=kw["kwargs"])


def _batch(model, n, b, seed=0):
    rng = np.random.default_rng(seed)
    if model.factory.endswith("char_transformer"):
        x = rng.integers(0, model.classes, (n, b, model.dim)).astype(np.float32)
    else:
        x = rng.standard_normal((n, b, model.dim)).astype(np.float32)
    return x, rng.integers(0, model.classes, (n, b))


def test_dlpack_shares_memory_without_a_copy():  # pragma: no cover - needs a GPU
    import cupy as cp

    from tgsim.torch.model import _tensor

    a = cp.arange(8, dtype=cp.float32)
    t = _tensor(torch, a)
    assert t.is_cuda and t.data_ptr() == a.data.ptr
    t.add_(1)
    torch.cuda.current_stream().synchronize()
    assert float(a[0].get()) == 1.0


@pytest.mark.parametrize("name", list(MODELS))
def test_a_workers_gpu_gradient_is_its_gradient_alone(name):  # pragma: no cover - needs a GPU
    import cupy as cp

    model = _model(name)
    params = {k: cp.asarray(v) for k, v in model.init(0).items()}
    x, y = _batch(model, 3, 8)
    _, batched = model.loss_and_grad(params, cp.asarray(x), cp.asarray(y))
    for i in range(3):
        _, alone = model.loss_and_grad(params, cp.asarray(x[i:i + 1]), cp.asarray(y[i:i + 1]))
        for k in batched:
            assert batched[k][i].get().tobytes() == alone[k][0].get().tobytes(), (name, i, k)


@pytest.mark.parametrize("name", list(MODELS))
def test_gpu_and_cpu_gradients_agree(name):  # pragma: no cover - needs a GPU
    import cupy as cp

    model = _model(name)
    host = model.init(1)
    x, y = _batch(model, 2, 8, seed=1)
    loss_c, cpu = model.loss_and_grad(host, x, y)
    loss_g, gpu = model.loss_and_grad({k: cp.asarray(v) for k, v in host.items()}, cp.asarray(x), cp.asarray(y))
    np.testing.assert_allclose(cp.asnumpy(loss_g), loss_c, rtol=1e-4)
    for k in cpu:
        np.testing.assert_allclose(gpu[k].get(), cpu[k], rtol=1e-3, atol=1e-5, err_msg=k)


def test_deterministic_settings_hold_inside_a_call_only():  # pragma: no cover - needs a GPU
    from tgsim.torch.model import gpu_determinism

    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    with gpu_determinism(torch):
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark and not torch.backends.cuda.matmul.allow_tf32
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark) == before


def test_torch_digits_on_the_gpu_reaches_the_cpu_accuracy(tmp_path):  # pragma: no cover - needs a GPU
    from tgsim.train.config import load
    from tgsim.train.loop import run

    cpu = run(load("tgsim/configs/torch_digits.toml"), out=tmp_path / "cpu", quiet=True)
    gpu = run(load("tgsim/configs/torch_digits.toml", ["run.backend=cupy"]), out=tmp_path / "gpu", quiet=True)
    assert abs(gpu.test_accuracy - cpu.test_accuracy) <= 0.03, (gpu.test_accuracy, cpu.test_accuracy)


@needs_mpi
def test_mpi_on_the_gpu_equals_the_gpu_simulator(tmp_path):  # pragma: no cover - needs a GPU
    from tgsim.train.config import load
    from tgsim.train.loop import run

    over = ["run.backend=cupy", "run.steps=30", "workers.n=2", "run.checkpoint_every=0"]
    sets = [a for o in over for a in ("--set", o)]
    res, _ = mpiexec([(2, ["-m", "tgsim.mpi_runs.train", "tgsim/configs/torch_digits.toml", *sets,
                           "--out", str(tmp_path / "mpi"), "--quiet"])], timeout=300)
    assert res.returncode == 0, res.report()
    sim = run(load("tgsim/configs/torch_digits.toml", over), out=tmp_path / "sim", quiet=True)
    assert params_bits(load_params(tmp_path / "mpi" / "params.npz")) == \
        params_bits({k: np.asarray(v.get()) for k, v in sim.params.items()})


def _gpu_config(n: int) -> dict:
    """The DDP tests' TernGrad all-reduce config (tests/torch_ddp_cases.py) on the GPU backend, n workers
    of 16 samples, no checkpoints."""
    d = ddp_config({"name": "terngrad"}, "allreduce")
    d["run"] = {**d["run"], "backend": "cupy", "checkpoint_every": 0}
    d["workers"] = {"n": n, "batch": 16 * n}
    return d


@needs_mpi
def test_ddp_hook_on_the_gpu_equals_the_gpu_simulator(tmp_path):  # pragma: no cover - needs a GPU
    config = _gpu_config(2)
    cases = {"train": {"terngrad": {"config": config, "steps": STEPS, "bucket_cap_mb": BUCKET_CAP_MB,
                                    "bucket_view": False}}}
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "out").mkdir()
    driver = Path(__file__).resolve().parent / "torch_ddp_driver.py"
    res, _ = mpiexec([(2, [str(driver), str(tmp_path / "cases.json"), str(tmp_path / "out")])], timeout=300)
    assert res.returncode == 0, res.report()
    ranks = json.loads((tmp_path / "out" / "results.json").read_text())
    assert all(r["train"]["terngrad"]["error"] is None for r in ranks), ranks
    sim = simulate(config, tmp_path / "sim")
    assert params_bits(load_params(tmp_path / "out" / "terngrad.npz")) == \
        params_bits({k: np.asarray(v.get()) for k, v in sim.params.items()})


def test_ddp_hook_over_nccl_equals_the_gpu_simulator(tmp_path):  # pragma: no cover - needs a GPU
    """DDP over NCCL with the hook's exchange on the same process group (transport "torch": NCCL for the
    CuPy buffers, a Gloo group for host ones), one rank on GPU 0 (NCCL refuses two ranks on one GPU),
    5 steps of TernGrad: the 1-worker GPU simulator's parameters bit for bit."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tgsim.data import batch_indices
    from tgsim.torch import ddp as tgddp
    from tgsim.train.config import from_dict
    from tgsim.train.loop import build

    if not dist.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    config = _gpu_config(1)
    cfg = from_dict(config)
    setup = build(cfg)
    torch.cuda.set_device(0)
    module = setup.model.build(cfg.run.seed).to("cuda:0")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        state = tgddp.TgsimHookState.create(module, config, transport="torch")
        model = DDP(module, device_ids=[0])
        tgddp.register(model, state)
        opt = tgddp.TgsimOptimizer(state)
        b = cfg.workers.per_worker_batch
        for step in range(STEPS):
            idx = batch_indices(setup.shards[0], b, cfg.run.seed, step, 0)
            x = torch.from_numpy(setup.dataset.x_train[idx]).to("cuda:0")
            y = torch.from_numpy(setup.dataset.y_train[idx]).to("cuda:0")
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        got = {k: p.detach().cpu().numpy() for k, p in tgddp.named_parameters(module).items()}
    finally:
        dist.destroy_process_group()
    sim = simulate(config, tmp_path / "sim")
    assert state.step == STEPS
    assert params_bits(got) == params_bits({k: np.asarray(v.get()) for k, v in sim.params.items()})
