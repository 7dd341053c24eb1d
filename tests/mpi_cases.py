"""Helpers of the tests that run training under `mpiexec` and compare it with the simulator (a plain
module: `from mpi_cases import mpiexec, config_dict, simulate`).

* `MPI_INSTALL` (tests/mpi_launch.py's DEFAULT: this interpreter's MPI, probed at import),
  `MPIEXEC` (None when there is none), `HAVE_MPI4PY`, `needs_mpi` (skip mark with the reason).
* `mpiexec(groups, timeout, **env)`: one MPI job through mpi_launch, and its wall time.
* `config_dict(model, mode, **sections)`: a run's config from MODELS x MODES (CORE_MODES: the
  packed-code modes; OWN_WIRE: the codecs with their own wire format, in ps and allgather);
  `write_toml`, `simulate` (the in-process reference run), `train_losses` (metrics.csv),
  `params_bits`, `params_digest`, `load_params`.
* `_DRIVER`: the script each rank runs: every case of a JSON file through MPIExchange, the digest
  of the final parameters gathered on rank 0.
* `cases_over_mpi_equal_the_simulator(tmp_path, cases, ranks, timeout)`: one job of `_DRIVER` over
  `cases` (name -> config dict); each case must end with the simulator's parameters on every rank, bit
  for bit, and the same training losses. Returns (name, MPI run dir, simulator run dir) per case.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tgsim.codecs import registry
from tgsim.train.config import from_dict

REPO = Path(__file__).resolve().parents[1]
STEPS = 100
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

from mpi_launch import DEFAULT as MPI_INSTALL, Job  # noqa: E402
from fakes import one_numba_thread  # noqa: E402


def _find_mpiexec() -> str | None:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


MPIEXEC = MPI_INSTALL.mpiexec if MPI_INSTALL.ok else None      # None: the MPI tests skip
try:
    import mpi4py  # noqa: F401

    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False

needs_mpi = pytest.mark.skipif(not (HAVE_MPI4PY and MPIEXEC), reason=MPI_INSTALL.skip_reason())


def mpiexec(groups: list[tuple[int, list[str]]], timeout: float, **env) -> tuple[Job, float]:
    """Run `mpiexec [flags] -n a ARGS : -n b ARGS2 ...` (python -m / script args) from the repo root
    under this interpreter's MPI (tests/mpi_launch.py): the job (a CompletedProcess with `.report()`,
    `.started`, `.killed_by_signal()`) and its wall time. The job runs in its own session; on timeout
    the whole session is killed and the test fails, as it does when the job never started."""
    job = MPI_INSTALL.run(groups, timeout, **env)
    return job, job.took


def params_bits(params: dict) -> dict:
    return {k: np.ascontiguousarray(np.asarray(v)).tobytes() for k, v in params.items()}


def load_params(path: Path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def params_digest(params: dict) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(np.asarray(params[k])).tobytes()
                                   for k in sorted(params))).hexdigest()


# -- configs ---------------------------------------------------------------------------------------------

MODELS = {
    "ls": {"data": {"name": "least_squares"}, "model": {"name": "least_squares"}},
    "mlp": {"data": {"name": "digits"}, "model": {"name": "mlp", "options": {"hidden": [32]}},
            "codec": {"min_size": 40}},                     # the bias vectors travel as float32
}
MODES = {
    "fp32": {"codec": {"name": "fp32"}, "exchange": {"mode": "allreduce"}},
    "allreduce": {"exchange": {"mode": "allreduce"}},
    "ps": {"exchange": {"mode": "ps"}},
    "allgather": {"exchange": {"mode": "allgather"}},
    "ps-reternarize": {"exchange": {"mode": "ps", "reternarize_downlink": True}},
    # the scaler-sharing modes: the mean of the workers' scalers (every worker clips at it), none
    "ps-mean": {"codec": {"sharing": "mean"}, "exchange": {"mode": "ps"}},
    "allreduce-mean": {"codec": {"sharing": "mean"}, "exchange": {"mode": "allreduce"}},
    "allgather-none": {"codec": {"sharing": "none"}, "exchange": {"mode": "allgather"}},
    "ps-model": {"codec": {"scope": "model"}, "exchange": {"mode": "ps"}},
}
# every registered codec with its own wire format, in both modes that carry whole messages
OWN_WIRE = [name for name in registry.names()
            if registry.make_codec(from_dict({"codec": {"name": name}}).codec).properties.wire == "own"]
for _name in OWN_WIRE:
    MODES[f"{_name}-ps"] = {"codec": {"name": _name}, "exchange": {"mode": "ps"}}
    MODES[f"{_name}-allgather"] = {"codec": {"name": _name}, "exchange": {"mode": "allgather"}}
CORE_MODES = [m for m in MODES if m.rsplit("-", 1)[0] not in OWN_WIRE]


def config_dict(model: str, mode: str, **sections) -> dict:
    d = {
        "run": {"name": f"{model}-{mode}", "seed": 3, "steps": STEPS, "eval_every": 50, "log_every": 10,
                "checkpoint_every": 0},
        "data": {}, "model": {},
        "workers": {"n": 4, "batch": 32},
        "codec": {"name": "terngrad", "clip": "explicit"},
        "exchange": {},
        "optimizer": {"name": "momentum"},
        "schedule": {"name": "constant", "lr": 0.05},
    }
    for extra in (MODELS[model], MODES[mode], sections):
        for sec, values in extra.items():
            switch = sec == "codec" and values.get("name", d[sec].get("name")) != d[sec].get("name")
            d[sec] = dict(values) if switch else {**d[sec], **values}   # another codec: not terngrad's keys
    return d


def write_toml(d: dict, path: Path) -> Path:
    import tomli_w

    path.write_bytes(tomli_w.dumps(d).encode())
    return path


def simulate(d: dict, out: Path):
    """The reference: the simulator's N virtual workers in this process."""
    from tgsim.train.config import from_dict
    from tgsim.train.loop import run

    with one_numba_thread():
        return run(from_dict(d), out=out, quiet=True)


def train_losses(out: Path) -> list[str]:
    import csv

    with open(out / "metrics.csv", newline="") as f:
        return [r["loss"] for r in csv.DictReader(f) if r["split"] == "train" and r["layer"] == "model"]


_DRIVER = textwrap.dedent("""
    import hashlib, json, sys, traceback
    import numpy as np
    from mpi4py import MPI
    from tgsim.exchange.mpi import MPIExchange
    from tgsim.train.config import from_dict
    from tgsim.train.loop import run

    ex = MPIExchange()
    try:
        cases = json.loads(open(sys.argv[1]).read())
        digests = {}
        for name, d in cases.items():
            res = run(from_dict(d), out=f"{sys.argv[2]}/{name}", quiet=True, exchange=ex, writer=ex.rank == 0)
            h = hashlib.sha256(b"".join(np.ascontiguousarray(res.params[k]).tobytes()
                                        for k in sorted(res.params))).hexdigest()
            digests[name] = ex.comm.gather(h, root=0)
        if ex.rank == 0:
            open(f"{sys.argv[2]}/digests.json", "w").write(json.dumps(digests))
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    """)


def cases_over_mpi_equal_the_simulator(tmp_path: Path, cases: dict, ranks: int, timeout: float,
                                       simulated: dict | None = None) -> list[tuple[str, Path, Path]]:
    """mpiexec -n `ranks` runs every case of `cases` (name -> config dict) in one `_DRIVER` job, under
    tmp_path/mpi/NAME; the simulator runs each under tmp_path/sim/NAME. Asserts, per case: rank 0's
    parameters equal the simulator's bit for bit, every rank's digest equals them (the replicas agree),
    and metrics.csv holds the same training losses. `simulated` (name -> MPI run dir) adds cases the
    caller ran itself (e.g. through `python -m tgsim.mpi_runs.train`), checked the same way but for the
    digests. Returns (name, MPI run dir, simulator run dir) for each case, in order."""
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    res, _ = mpiexec([(ranks, [str(driver), str(tmp_path / "cases.json"), str(tmp_path / "mpi")])], timeout=timeout)
    assert res.returncode == 0, res.report()
    digests = json.loads((tmp_path / "mpi" / "digests.json").read_text())
    runs = [(name, tmp_path / "mpi" / name, d) for name, d in cases.items()]
    runs += [(name, out, d) for name, (out, d) in (simulated or {}).items()]
    checked = []
    for name, mpi_out, d in runs:
        sim_out = tmp_path / "sim" / name
        sim = simulate(d, sim_out)
        assert params_bits(load_params(mpi_out / "params.npz")) == params_bits(sim.params), \
            f"{name}: MPI and simulator parameters differ"
        if name in digests:
            assert set(digests[name]) == {params_digest(sim.params)}, f"{name}: replicas differ across ranks"
        assert train_losses(mpi_out) == train_losses(sim_out), f"{name}: losses differ"
        checked.append((name, mpi_out, sim_out))
    return checked
