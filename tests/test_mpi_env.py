"""tgsim/exchange/mpi_env.py: which launcher started a rank, which MPI mpi4py loaded, and the one-line
errors of the MPI entry points (mocked environments; two end-to-end runs without mpiexec)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import tgsim.exchange.mpi  # noqa: F401  (imported at collection: tools/mutation.py counts module-level
import tgsim.exchange.mpi_env  # noqa: F401  lines as run at import)
from tgsim.exchange import mpi_env as me

REPO = Path(__file__).resolve().parents[1]

# MPI_Get_library_version() as the libraries print it (first lines)
MPICH = "MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026\nMPICH ABI:          18:2:6\n"
OPENMPI = "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11, repo rev: v5.0.11"
INTEL = "Intel(R) MPI Library 2021.13 for Linux* OS\n"
CRAY = "MPI VERSION    : CRAY MPICH version 8.1.28.2 (ANL base 3.4a2)\nMPI BUILD INFO : ..."
MVAPICH = "MVAPICH2 Version      :\t2.3.7\nMVAPICH2 Release date :\tWed March 02 22:00:00 EST 2022"

# the variables each launcher sets in a rank's environment (rank 1 of 4), besides the user's
HYDRA = {"HYDI_CONTROL_FD": "7", "PMI_FD": "9", "PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "4"}
PRTE = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "1",
        "PMIX_NAMESPACE": "prterun-vm-1@1", "OMPI_VERSION": "5.0.11"}
SLURM_JOB = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_NODEID": "0"}   # batch script
SRUN = {**SLURM_JOB, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "1"}
USER = {"HOME": "/root", "PATH": "/usr/bin"}


# -- who launched this rank ---------------------------------------------------------------------------------

def test_launcher_is_read_from_each_launchers_variables():
    assert me.launcher(USER) is None
    assert me.launcher({**USER, **SLURM_JOB}) is None               # the batch script itself: no launcher
    assert me.launcher({**USER, **HYDRA}) == me.Launcher("mpich", 4, "PMI_SIZE=4")
    assert me.launcher({**USER, **PRTE}) == me.Launcher("openmpi", 4, "OMPI_COMM_WORLD_SIZE=4")
    assert me.launcher({**USER, **SRUN}) == me.Launcher("srun", 4, "SLURM_STEP_NUM_TASKS=4", "")
    assert me.launcher({**SRUN, "PMIX_RANK": "1"}).pmi == "pmix"
    assert me.launcher({**SRUN, "PMI_FD": "5", "PMI_SIZE": "4"}).pmi == "pmi2"
    # mpirun inside an sbatch script: the ranks carry the batch step's SLURM_* and Open MPI's own
    assert me.launcher({**SLURM_JOB, **PRTE}).kind == "openmpi"
    assert me.launcher({"PALS_RANKID": "3", "PMI_SIZE": "8"}) == me.Launcher("pmi", 8, "PMI_SIZE=8")


def test_describe_names_the_launcher_and_its_evidence():
    assert me.launcher(PRTE).describe() == "Open MPI's mpiexec (OMPI_COMM_WORLD_SIZE=4)"
    assert me.launcher(HYDRA).describe() == "MPICH's Hydra mpiexec (PMI_SIZE=4)"
    assert me.launcher(SRUN).describe() == "srun (SLURM_STEP_NUM_TASKS=4, no --mpi plugin)"
    assert me.launcher({**SRUN, "PMIX_RANK": "1"}).describe() == "srun (SLURM_STEP_NUM_TASKS=4, --mpi=pmix)"


# -- which library mpi4py loaded ------------------------------------------------------------------------

@pytest.mark.parametrize("text,family,name", [
    (MPICH, "mpich", "MPICH 5.0.2"), (OPENMPI, "openmpi", "Open MPI 5.0.11"),
    (INTEL, "mpich", "Intel(R) MPI Library 2021.13 for Linux* OS"), (CRAY, "mpich", "CRAY MPICH 8.1.28.2"),
    (MVAPICH, "mpich", "MVAPICH2 2.3.7"), ("Microsoft MPI 10.1\n", "", "Microsoft MPI 10.1"), ("", "", "an unknown MPI"),
])
def test_library_family_and_name(text, family, name):
    assert me.library_family(text) == family
    assert me.library_name(text) == name


# -- before MPI_Init: launcher and library of different MPIs -----------------------------------------------

def test_open_mpis_launcher_with_mpich_in_mpi4py_names_both_and_the_mpiexec_to_use(tmp_path):
    (tmp_path / "python").touch()
    (tmp_path / "mpiexec").touch()
    with pytest.raises(me.MPIEnvironmentError) as e:
        me.check_before_init({**USER, **PRTE}, MPICH, python=str(tmp_path / "python"))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("this rank was started by Open MPI's mpiexec (OMPI_COMM_WORLD_SIZE=4) but mpi4py "
                          "loaded MPICH 5.0.2: mpiexec and mpi4py come from different MPIs; launch with "
                          f"{tmp_path / 'mpiexec'} (the mpiexec next to this Python")
    assert msg.endswith("(TGSIM_MPI_CHECK=0 skips this check)")


def test_hydra_with_open_mpi_in_mpi4py_and_no_mpiexec_nearby_says_how_to_rebuild_mpi4py(tmp_path):
    with pytest.raises(me.MPIEnvironmentError, match=r"^this rank was started by MPICH's Hydra mpiexec "
                       r"\(PMI_SIZE=4\) but mpi4py loaded Open MPI 5\.0\.11: .* rebuild mpi4py against the "
                       r"launcher's MPI: MPICC=\$\(which mpicc\) pip install --no-binary=mpi4py"):
        me.check_before_init({**USER, **HYDRA}, OPENMPI, python=str(tmp_path / "python"))


@pytest.mark.parametrize("env,version", [
    (HYDRA, MPICH), (HYDRA, INTEL), (HYDRA, MVAPICH), (PRTE, OPENMPI),   # the same MPI
    (USER, MPICH), (SRUN, OPENMPI), ({**SRUN, "PMIX_RANK": "1"}, MPICH),  # nothing to compare before MPI_Init
    (HYDRA, "Microsoft MPI 10.1"),                                       # a library it does not know
    ({**PRTE, "TGSIM_MPI_CHECK": "0"}, MPICH),                           # switched off
])
def test_before_init_passes(env, version):
    me.check_before_init(env, version)


# -- after MPI_Init: one rank where the launcher started several, or no launcher at all ----------------

def test_no_launcher_and_one_rank_says_to_use_mpiexec():
    with pytest.raises(me.MPIEnvironmentError) as e:
        me.check_after_init(USER, MPICH, 1, "tgsim.mpi_runs.train")
    assert str(e.value) == ("started without mpiexec, so MPI runs it as a one-rank job (one worker per rank): "
                            "start it with mpiexec -n N python -m tgsim.mpi_runs.train ... (srun under Slurm); "
                            "`tgsim run` simulates N workers in one process (TGSIM_MPI_CHECK=0 skips this check)")
    with pytest.raises(me.MPIEnvironmentError, match="started without mpiexec"):
        me.check_after_init(SLURM_JOB, OPENMPI, 1, "tgsim.mpi_runs.train")     # in the batch script, without srun


def test_a_launcher_of_n_processes_and_one_rank_in_each_is_a_mismatch():
    with pytest.raises(me.MPIEnvironmentError, match=r"^a PMI launcher \(PMI_SIZE=4\) started 4 processes but "
                       r"MPICH 5\.0\.2 sees 1 rank in each: the launcher and mpi4py come from different MPIs"):
        me.check_after_init({"PALS_RANKID": "1", "PMI_SIZE": "4"}, MPICH, 1)
    with pytest.raises(me.MPIEnvironmentError, match=r"^srun \(SLURM_STEP_NUM_TASKS=4, no --mpi plugin\) started 4 "
                       r"processes but Open MPI 5\.0\.11 sees 1 rank in each: .*pass srun --mpi=pmix"):
        me.check_after_init(SRUN, OPENMPI, 1)


@pytest.mark.parametrize("env,size", [
    (HYDRA, 4), (PRTE, 4), (SRUN, 4), ({**HYDRA, "PMI_SIZE": "1"}, 1),  # mpiexec -n 1 is a launch
    ({**USER, "TGSIM_MPI_CHECK": "0"}, 1), (USER, 3),                   # switched off; an unknown launcher
])
def test_after_init_passes(env, size):
    me.check_after_init(env, MPICH, size, "tgsim.mpi_runs.train")


# -- the entry points ---------------------------------------------------------------------------------------

def test_without_mpi4py_load_mpi_names_the_extras(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)          # `import mpi4py` raises ImportError
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    with pytest.raises(me.MPIEnvironmentError, match=r"^mpi4py is not installed \(.*\); pip install -e "
                       r"'\.\[mpich\]' \(or '\.\[openmpi\]'"):
        me.load_mpi("tgsim.mpi_runs.train", environ=USER)


def _entry(code: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in {*HYDRA, *PRTE, *SRUN, "PMIX_RANK", "TGSIM_MPI_CHECK"}}
    e.update(PYTHONPATH=os.pathsep.join([str(REPO), e.get("PYTHONPATH", "")]), **env)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=e, capture_output=True, text=True, timeout=120)


def test_train_without_mpi4py_ends_in_one_line_naming_the_fix():
    """`python -m tgsim.mpi_runs.train tgsim/configs/demo.toml` without mpi4py: exit status 2, one line."""
    res = _entry("import sys; sys.modules['mpi4py'] = None\n"
                 "from tgsim.mpi_runs.train import main; sys.exit(main(['tgsim/configs/demo.toml']))")
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith("tgsim.mpi_runs.train: mpi4py is not installed (") and ".[mpich]" in res.stderr


def test_selftest_started_without_mpiexec_ends_in_one_line():
    pytest.importorskip("mpi4py")
    res = _entry("import sys; from tgsim.mpi_runs.selftest import main; sys.exit(main([]))")
    if "mpi4py found no MPI library" in res.stderr:
        pytest.skip(f"mpi4py has no MPI library here: {res.stderr.strip()}")
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith("tgsim.mpi_runs.selftest: started without mpiexec, so MPI runs it as a one-rank job")
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr


class _FakeMPI:
    THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 10, 11, 12, 13

    def __init__(self, version="MPICH Version:      5.0.2\n", initialized=False, size=4):
        self.version, self.initialized, self.calls = version, initialized, []
        self.COMM_WORLD = types.SimpleNamespace(Get_size=lambda: size)

    def Get_library_version(self):
        return self.version

    def Is_initialized(self):
        return self.initialized

    def Init(self):
        self.calls.append(("Init",))

    def Init_thread(self, level):
        self.calls.append(("Init_thread", level))


def _fake_mpi4py(monkeypatch, mpi, preloaded=False, rc=None, fail=None):
    """sys.modules["mpi4py"] -> a stand-in whose `MPI` is `mpi` (or whose import raises `fail`);
    records rc.initialize at the moment MPI is imported."""
    import sys

    seen = []

    class Pkg(types.ModuleType):
        def __getattr__(self, name):
            if name != "MPI":
                raise AttributeError(name)
            seen.append((self.rc.initialize, getattr(self.rc, "finalize", None)))
            if fail is not None:
                raise fail
            return mpi

    pkg = Pkg("mpi4py")
    pkg.rc = rc or types.SimpleNamespace(initialize=True, thread_level="multiple")
    monkeypatch.setitem(sys.modules, "mpi4py", pkg)
    if preloaded:
        monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    else:
        monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    return pkg, seen


HYDRA4 = {"HYDI_CONTROL_FD": "7", "PMI_SIZE": "4"}


OMPI4 = {"OMPI_COMM_WORLD_SIZE": "4"}


@pytest.mark.mutation
@pytest.mark.parametrize("level, want", [("multiple", 13), ("Serialized", 12), ("funneled", 11),
                                         ("single", 10), ("odd", 13)])
def test_load_mpi_initializes_after_the_check_at_mpi4pys_level(monkeypatch, level, want):
    """A fresh import: mpi4py is told not to initialize (rc.initialize False while MPI is imported,
    finalize True), rc.initialize is restored to True afterwards, and MPI is initialized with
    Init_thread at rc.thread_level (unknown names: MULTIPLE)."""
    from tgsim.exchange import mpi_env as me

    mpi = _FakeMPI()
    pkg, seen = _fake_mpi4py(monkeypatch, mpi, rc=types.SimpleNamespace(initialize=True, thread_level=level))
    assert me.load_mpi("prog", environ=HYDRA4) is mpi
    assert seen == [(False, True)] and pkg.rc.initialize is True
    assert mpi.calls == [("Init_thread", want)]


@pytest.mark.mutation
@pytest.mark.parametrize("threads", [False, "no"])
def test_load_mpi_plain_init_when_mpi4py_wants_no_threads(monkeypatch, threads):
    """rc.threads False (or "no"): plain MPI_Init."""
    from tgsim.exchange import mpi_env as me

    mpi = _FakeMPI()
    _fake_mpi4py(monkeypatch, mpi, rc=types.SimpleNamespace(initialize=True, threads=threads, thread_level="single"))
    me.load_mpi("prog", environ=HYDRA4)
    assert mpi.calls == [("Init",)]


@pytest.mark.mutation
def test_load_mpi_checks_before_init_and_skips_init_when_initialized(monkeypatch):
    """Open MPI's launcher with MPICH loaded: MPIEnvironmentError before MPI_Init (never called). An
    MPI imported and initialized already (a wrapper did it): rc is left alone, no Init, and only the
    after-init check runs (here: no launcher and one rank, refused)."""
    from tgsim.exchange import mpi_env as me

    mpi = _FakeMPI()
    _fake_mpi4py(monkeypatch, mpi)
    with pytest.raises(me.MPIEnvironmentError, match="mpiexec and mpi4py come from different MPIs"):
        me.load_mpi("prog", environ=OMPI4)
    assert mpi.calls == []
    done = _FakeMPI(initialized=True, size=1)
    pkg, seen = _fake_mpi4py(monkeypatch, done, preloaded=True,
                             rc=types.SimpleNamespace(initialize="untouched", thread_level="single"))
    with pytest.raises(me.MPIEnvironmentError, match="started without mpiexec"):
        me.load_mpi("prog", environ={})
    assert done.calls == [] and pkg.rc.initialize == "untouched" and seen == [("untouched", None)]
    assert me.load_mpi("prog", environ={"TGSIM_MPI_CHECK": "0"}) is done


@pytest.mark.mutation
@pytest.mark.parametrize("err", [ImportError("libmpi.so.12: cannot open"), RuntimeError("x\nlast line"),
                                 OSError("")])
def test_load_mpi_without_a_loadable_library(monkeypatch, err):
    """mpi4py.MPI failing to import: one MPIEnvironmentError quoting the error's last line (or its type
    when it has no text); rc.initialize is restored even then."""
    from tgsim.exchange import mpi_env as me

    pkg, _ = _fake_mpi4py(monkeypatch, None, fail=err)
    with pytest.raises(me.MPIEnvironmentError) as e:
        me.load_mpi("prog", environ=HYDRA4)
    last = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    assert str(e.value).startswith(f"mpi4py found no MPI library it can load ({last}); pip install")
    assert pkg.rc.initialize is True


@pytest.mark.mutation
def test_mpi_or_exit_writes_one_line_and_exits_2(monkeypatch, capfd):
    """mpi_or_exit: load_mpi's MPI when it works; on MPIEnvironmentError `PROG: message` as one line
    on stderr (ending with the hint that TGSIM_MPI_CHECK=0 skips the check) and exit status 2."""
    from tgsim.exchange import mpi_env as me

    mpi = _FakeMPI()
    _fake_mpi4py(monkeypatch, mpi)
    monkeypatch.setattr(me.os, "environ", dict(HYDRA4))
    assert me.mpi_or_exit("prog") is mpi
    monkeypatch.setattr(me.os, "environ", dict(OMPI4))
    with pytest.raises(SystemExit) as e:
        me.mpi_or_exit("prog")
    assert e.value.code == 2
    err = capfd.readouterr().err
    assert err.startswith("prog: this rank was started by Open MPI's mpiexec") and err.count("\n") == 1
    assert err.endswith(" (TGSIM_MPI_CHECK=0 skips this check)\n")


@pytest.mark.mutation
@pytest.mark.parametrize("env, want", [
    ({"I_MPI_HYDRA_TOPOLIB": "hwloc", "PMI_SIZE": "4"}, ("mpich", 4, "PMI_SIZE=4", "")),     # Intel MPI's Hydra
    ({"HYDI_CONTROL_FD": "7"}, ("mpich", 0, "PMI_SIZE=?", "")),                             # size not said: 0
    ({"SLURM_STEP_NUM_TASKS": "3"}, ("srun", 3, "SLURM_STEP_NUM_TASKS=3", "")),
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "5"}, ("srun", 5, "SLURM_STEP_NUM_TASKS=5", "")),
    ({"SLURM_STEP_ID": "0"}, ("srun", 0, "SLURM_STEP_NUM_TASKS=?", "")),
    ({"SLURM_STEP_NUM_TASKS": "8(x2)", "PMI_FD": "3"}, ("srun", 8, "SLURM_STEP_NUM_TASKS=8(x2)", "pmi2")),
    ({"SLURM_STEP_NUM_TASKS": "2", "PMI_SIZE": "2"}, ("srun", 2, "SLURM_STEP_NUM_TASKS=2", "pmi2")),
    ({"PMI_SIZE": "6"}, ("pmi", 6, "PMI_SIZE=6", "")),
    ({"PMIX_RANK": "1"}, ("pmi", 0, "PMIX_RANK=1", "")),
    ({"PMI_RANK": "2"}, ("pmi", 0, "PMI_RANK=2", "")),
    ({"PALS_RANKID": "3"}, ("pmi", 0, "PALS_RANKID=3", "")),
    ({"ALPS_APP_PE": "4"}, ("pmi", 0, "ALPS_APP_PE=4", "")),
    ({"MPI_LOCALNRANKS": "2"}, ("pmi", 0, "MPI_LOCALNRANKS=2", "")),
])
def test_launcher_from_each_variable_alone(env, want):
    """Each variable a launcher sets, alone: the kind, the size it says (0 when it says none or
    something that is not a number; Slurm's "8(x2)" is 8), the evidence and srun's PMI plugin."""
    from tgsim.exchange import mpi_env as me

    who = me.launcher(env)
    assert (who.kind, who.size, who.evidence, who.pmi) == want


@pytest.mark.mutation
def test_launcher_records_are_frozen_and_srun_defaults_to_no_plugin():
    """A Launcher is immutable; built without `pmi`, an srun launcher has no --mpi plugin."""
    import dataclasses

    from tgsim.exchange import mpi_env as me

    who = me.Launcher("srun", 2, "E")
    assert who.pmi == "" and who.describe() == "srun (E, no --mpi plugin)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        who.size = 3


@pytest.mark.mutation
def test_library_name_without_a_comma_and_of_an_unknown_library():
    """"Open MPI v5.0.3" (no comma after the version) is "Open MPI 5.0.3"; an unknown library's
    first line is cut at 60 characters."""
    from tgsim.exchange import mpi_env as me

    assert me.library_name("Open MPI v5.0.3") == "Open MPI 5.0.3"
    assert me.library_name("Q" * 70 + "\nsecond") == "Q" * 60


@pytest.mark.mutation
@pytest.mark.parametrize("off", ["0", "no", "false", "off", " OFF "])
def test_every_off_value_skips_both_checks(off):
    """TGSIM_MPI_CHECK=0/no/false/off (any case, spaces around) skips the checks before and after
    MPI_Init that would otherwise refuse these environments."""
    from tgsim.exchange import mpi_env as me

    mismatch = ({"OMPI_COMM_WORLD_SIZE": "4"}, "MPICH Version:      5.0.2\n")
    with pytest.raises(me.MPIEnvironmentError):
        me.check_before_init(*mismatch)
    me.check_before_init({**mismatch[0], "TGSIM_MPI_CHECK": off}, mismatch[1])
    me.check_after_init({"TGSIM_MPI_CHECK": off}, "MPICH", 1)
    me.check_after_init({"PMI_SIZE": "2", "TGSIM_MPI_CHECK": off}, "MPICH", 1)


@pytest.mark.mutation
def test_two_processes_seen_as_one_rank_each_is_refused():
    """A launcher that started 2 processes while MPI sees one rank in each: refused (1 process with 1
    rank is a launch of one)."""
    from tgsim.exchange import mpi_env as me

    with pytest.raises(me.MPIEnvironmentError, match="started 2 processes but MPICH 5.0.2 sees 1 rank"):
        me.check_after_init({"PMI_SIZE": "2"}, "MPICH Version:      5.0.2\n", 1)
    me.check_after_init({"PMI_SIZE": "1"}, "MPICH Version:      5.0.2\n", 1)
