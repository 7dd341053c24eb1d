"""The package as a user installs it: a wheel built from the sdist, installed (not editable) into a
fresh venv, used from a directory outside the repository.

One module-scoped fixture builds the sdist and the wheel (`python -m build`: the wheel is built from
the unpacked sdist, so a file missing from the sdist is missing from the wheel too), creates a venv,
installs the wheel with the `mpich` and `testing` extras and the example codec plugin (examples/plugin_codec) at the
versions of constraints.txt, and runs everything from a job directory in a temporary folder, with no
PYTHONPATH. The tests then check that

* every tracked source and data file of tgsim/, analysis/, mpi_runs/ and papers_figures/ is in the
  wheel, at its installed name (analysis/ -> tgsim/analysis/, ...), and in the sdist;
* every module imports from the installed copy (the figure scripts, which run when imported, and
  their helpers, which they import by bare name, are run through `tgsim figures` instead);
* `tgsim --version`, `tgsim codecs` (listing the plugin), a 10-step `tgsim run demo` (the packaged
  config) and one quick figure work; `mpiexec -n 2 python -m tgsim.mpi_runs.train demo` from the
  installed copy is heavy (`make test-slow`: tgsim.mpi_runs imports from it here, and every MPI test
  runs the same module through the venv's mpiexec).

The build and the install take about 1-2 minutes (pip's cache makes the install offline after the
first `make`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INSTALLED_AS = {"tgsim": "tgsim", "analysis": "tgsim/analysis", "mpi_runs": "tgsim/mpi_runs",
                "papers_figures": "tgsim/papers_figures"}
GENERATED = ("out/", "REPORT.md")          # papers_figures/ outputs, never shipped


def _env() -> dict:
    """A user's environment: no PYTHONPATH or venv of ours, and no thread-count variable (the user
    sets none: README, "Your PyTorch model")."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and "THREADS" not in k.upper()}
    env.update(MPLBACKEND="Agg", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def sh(cmd: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True,
                         timeout=timeout, start_new_session=True)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} exited {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def tracked_files() -> list[str]:
    """Repository-relative paths of the package's source and data files (git's list where there is a
    .git, else the files on disk), generated outputs and caches left out."""
    try:
        out = subprocess.run(["git", "ls-files", *INSTALLED_AS], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = [str(p.relative_to(REPO)) for d in INSTALLED_AS for p in (REPO / d).rglob("*") if p.is_file()]
    return sorted(f for f in out if "__pycache__" not in f and not any(
        f.startswith(f"papers_figures/{g}") for g in GENERATED))


def installed_name(path: str) -> str:
    top, _, rest = path.partition("/")
    return f"{INSTALLED_AS[top]}/{rest}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the venv's bin folder, the job directory, the dist folder): the wheel installed, not editable."""
    root = tmp_path_factory.mktemp("wheel")
    dist, venv, job = root / "dist", root / "venv", root / "job"
    job.mkdir()
    sh([sys.executable, "-m", "build", "--outdir", dist, REPO], cwd=root, timeout=600)
    sh([sys.executable, "-m", "venv", venv], cwd=root)
    wheel = next(dist.glob("tgsim-*.whl"))
    sh([venv / "bin/python", "-m", "pip", "install", "--quiet", "--no-compile", "-c", REPO / "constraints.txt",
        f"{wheel}[mpich,testing]", REPO / "examples/plugin_codec"], cwd=root, timeout=900)
    return venv / "bin", job, dist


def test_wheel_and_sdist_hold_every_source_and_data_file(installed):
    _, _, dist = installed
    files = tracked_files()
    assert any(f.startswith("tgsim/codecs/terngrad/") for f in files) and "mpi_runs/slurm_job.sh" in files
    with zipfile.ZipFile(next(dist.glob("tgsim-*.whl"))) as z:
        in_wheel = set(z.namelist())
    missing = [f for f in files if installed_name(f) not in in_wheel]
    assert not missing, f"not in the wheel: {missing}"
    assert not [n for n in in_wheel if n.startswith(("analysis/", "mpi_runs/", "papers_figures/", "tests/"))]
    with tarfile.open(next(dist.glob("tgsim-*.tar.gz"))) as t:
        in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    missing = [f for f in files + ["setup.py", "pyproject.toml", "README.md"] if f not in in_sdist]
    assert not missing, f"not in the sdist: {missing}"


IMPORT_ALL = """
import importlib, pathlib, sys
import tgsim
root = pathlib.Path(tgsim.__file__).resolve().parent
assert str(root).startswith(sys.prefix), f"tgsim imported from {root}, not from the venv {sys.prefix}"
names = []
for p in sorted(root.rglob("*.py")):
    parts = p.relative_to(root.parent).with_suffix("").parts
    if parts[1] == "papers_figures" and len(parts) == 3 and parts[2] != "__init__":
        continue                              # figure scripts and their helpers: run as scripts
    names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
failed = []
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed.append(f"{name}: {type(e).__name__}: {e}")
assert not failed, chr(10).join(failed)
print(len(names), "modules")
"""


def test_every_module_imports_from_the_installed_copy(installed):
    bin_, job, _ = installed
    out = sh([bin_ / "python", "-c", IMPORT_ALL], cwd=job).stdout
    n = int(out.split()[0])
    scripts = [f for f in tracked_files() if f.startswith("papers_figures/") and f.count("/") == 1
               and f.endswith(".py") and not f.endswith("__init__.py")]     # run as scripts, not imported
    assert n == len([f for f in tracked_files() if f.endswith(".py")]) - len(scripts)


def test_cli_runs_the_packaged_demo_and_lists_the_plugin(installed):
    bin_, job, _ = installed
    from tgsim import __version__

    assert sh([bin_ / "tgsim", "--version"], cwd=job).stdout.strip() == f"tgsim {__version__}"
    codecs = sh([bin_ / "tgsim", "codecs"], cwd=job).stdout
    assert any(line.startswith("sr_bf16 ") and "plugin" in line for line in codecs.splitlines()), codecs
    assert any(line.startswith("terngrad ") for line in codecs.splitlines())
    res = sh([bin_ / "tgsim", "run", "demo", "--out", "run", "--quiet", "--set", "run.steps=10"], cwd=job)
    assert "test loss" in res.stdout and (job / "run" / "params.npz").exists()
    res = sh([bin_ / "tgsim", "run", "demo", "--out", "run-plugin", "--quiet", "--set", "run.steps=10",
              "--set", "codec.name='sr_bf16'", "--set", "exchange.mode='ps'"], cwd=job)
    assert (job / "run-plugin" / "params.npz").exists()


@pytest.mark.heavy
def test_mpi_training_from_the_installed_package(installed):
    bin_, job, _ = installed
    res = sh([bin_ / "mpiexec", "-n", "2", bin_ / "python", "-m", "tgsim.mpi_runs.train", "demo", "--out", "mpi",
              "--quiet", "--set", "workers.n=2", "--set", "run.steps=20"], cwd=job, timeout=300)
    assert (job / "mpi" / "params.npz").exists() and (job / "mpi" / "comm_bytes_by_rank.json").exists(), res.stdout


@pytest.mark.heavy
def test_the_ddp_example_from_the_installed_package_ends_with_the_simulators_bits(installed):
    """The wheel's venv with torch added (`pip install torch`, the constraints' version), the example
    script and its model copied to a folder outside the repository, no thread variable set: under
    torchrun and under mpiexec, 2 ranks of TernGrad end with `tgsim run`'s parameters (the factory's
    module found in the working directory)."""
    import shutil

    import numpy as np

    bin_, job, _ = installed
    sh([bin_ / "python", "-m", "pip", "install", "--quiet", "--no-compile", "-c", REPO / "constraints.txt", "torch"],
       cwd=job, timeout=900)
    ex = job / "ddp-example"
    ex.mkdir(exist_ok=True)
    for name in ("ddp_train.py", "ddp_nets.py"):
        shutil.copy(REPO / "examples" / name, ex / name)
    args = ["ddp_train.py", "--codec", "terngrad", "--steps", "4", "--out"]
    sh([bin_ / "torchrun", "--nproc-per-node", "2", *args, "tr"], cwd=ex)
    sh([bin_ / "mpiexec", "-n", "2", bin_ / "python", *args, "mpi"], cwd=ex)
    sh([bin_ / "tgsim", "run", "tr/config.toml", "--out", "sim", "--quiet"], cwd=ex)
    with np.load(ex / "sim" / "params.npz") as z:
        want = {k: z[k] for k in z.files}
    for out in ("tr", "mpi"):
        with np.load(ex / out / "params.npz") as z:
            assert sorted(z.files) == sorted(want)
            assert all(np.array_equal(z[k], want[k]) for k in want), out


def test_a_figure_from_the_installed_package(installed):
    bin_, job, _ = installed
    res = sh([bin_ / "tgsim", "figures", "--quick", "least_squares_robbins_monro", "--out", "figs"], cwd=job,
             timeout=300)
    assert list((job / "figs" / "quick").glob("*.png")), res.stdout + res.stderr


def test_installed_netem_script_is_found_and_runs(installed):
    """tgsim bench exchange finds netem.sh inside the installed package (importlib.resources), and it runs."""
    bin_, job, _ = installed
    netem = Path(sh([bin_ / "python", "-c", "import tgsim.bench.exchange as e; print(e.NETEM)"], cwd=job).stdout.strip())
    assert netem.is_file() and netem.is_relative_to(bin_.parent)
    assert "exchange_rank" in sh(["bash", netem, "--help"], cwd=job).stdout
