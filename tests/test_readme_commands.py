"""Every command the README shows runs, in its quick form, and prints its key lines.

The commands are read from README.md's indented code lines that start with `make `, `.venv/bin/`
or `mpiexec`, after environment assignments if any (`PYTHONPATH=examples .venv/bin/...`); each must
have an entry in QUICK below (how to run it quickly, and what its output must contain), so a README
command that breaks, or a new one without a quick form, fails here.
`.venv/bin/X` runs as this interpreter's X (the test may run from another venv than the repo's);
`make demo` / `make bench` run through make only where this interpreter is the repo's `.venv`.
Outputs go to a temporary directory, never into the checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
IN_REPO_VENV = Path(sys.prefix).resolve() == (REPO / ".venv").resolve()


def readme_commands() -> list[str]:
    """The README's command lines (comments after two spaces and '#' removed)."""
    cmds = []
    for line in (REPO / "README.md").read_text().splitlines():
        m = re.match(r"^    ((?:[A-Z_]+=\S+ )*(?:make |\.venv/bin/|mpiexec).*)$", line)
        if m:
            cmds.append(re.split(r"\s{2,}#", m.group(1))[0].strip())
    return cmds


def _tgsim(*args: str) -> list[str]:
    return [str(BIN / "tgsim"), *args]


# README command -> (argv of its quick form given a temp dir, lines the output must contain)
QUICK = {
    "make demo": (lambda t: (["make", "--no-print-directory", "demo", f"ARGS=--set run.steps=20 --results {t} --quiet"]
                             if IN_REPO_VENV else _tgsim("demo", "--set", "run.steps=20", "--results", str(t),
                                                         "--quiet")),
                  ["== fp32: convnet1d on mnist1d, 8 workers, 20 steps", "== terngrad-max:", "fewer bits up than fp32",
                   "With the paper's MAX sharing at the same setting"]),
    "make test": (None, []),        # this very suite
    "make bench": (lambda t: (["make", "--no-print-directory", "bench", "ARGS=--quick"] if IN_REPO_VENV
                              else _tgsim("bench", "codec", "--quick")),
                   ["fused moments+encode 2bit clip=explicit", "fused weighted_sum"]),
    ".venv/bin/tgsim --version": (lambda t: _tgsim("--version"), ["tgsim 0."]),
    ".venv/bin/tgsim run demo --out results/my-run --set run.steps=500":
        (lambda t: _tgsim("run", "demo", "--out", str(t / "my-run"), "--set", "run.steps=20",
                          "--set", "run.checkpoint_every=10", "--set", "run.log_every=5", "--quiet"),
         ["test loss", "bits/worker up", "results: "]),
    ".venv/bin/tgsim run --resume --out results/my-run":
        (lambda t: _tgsim("run", "--resume", "--out", str(t / "my-run"), "--quiet"),
         ["already complete (20 steps)", "bits/worker up"]),
    ".venv/bin/tgsim codecs": (lambda t: _tgsim("codecs"), ["codec", "terngrad", "fp32"]),
    ".venv/bin/tgsim analyze unbiasedness": (lambda t: _tgsim("analyze", "unbiasedness", "--quick", "--out", str(t)),
                                             ["wrote "]),
    ".venv/bin/tgsim analyze unbiasedness --codec all":
        (lambda t: _tgsim("analyze", "unbiasedness", "--codec", "all", "--out", str(t)), ["consistent", "randomk"]),
    ".venv/bin/tgsim analyze run-health results/my-run":
        (lambda t: _tgsim("analyze", "run-health", str(t / "my-run")), ["ratio_max", "zero_last"]),
    # quick forms run by tests/test_compare.py (not twice)
    ".venv/bin/tgsim sweep demo --set codec.name=fp32,terngrad --set schedule.lr=0.05,0.1 --seeds 2 --out results/lr":
        (None, []),                                         # tests/test_sweep.py (a small grid, killed and resumed)
    ".venv/bin/tgsim plot results/lr --out results/lr.png": (None, []),     # tests/test_plot.py (a sweep directory)
    ".venv/bin/tgsim compare variance": (None, []),
    ".venv/bin/tgsim compare speedup": (None, []),
    ".venv/bin/tgsim compare bits": (None, []),             # tests/test_compare_bits.py
    ".venv/bin/tgsim compare time": (None, []),             # tests/test_compare_time.py
    "make figures": (None, []),                             # tests/test_figures_report.py (the quick form)
    "make figures QUICK=1": (None, []),                     # tests/test_figures_report.py
    "make figures-real": (None, []),                        # fig11's quick form: tests/test_figures_report.py
    "make figures-publish": (None, []),                     # tests/test_publish_report.py
    ".venv/bin/tgsim bench codec": (lambda t: _tgsim("bench", "codec", "--quick"),
                                    ["fused moments+encode 2bit clip=explicit", "floor read g"]),
    ".venv/bin/tgsim bench codec --codec all": (lambda t: _tgsim("bench", "codec", "--codec", "all", "--quick"),
                                                ["encode_x_read", "randomk"]),
    ".venv/bin/tgsim bench codec --codec terngrad --layers 100": (
        lambda t: _tgsim("bench", "codec", "--codec", "terngrad", "--layers", "100", "--quick"),
        ["encode_100_x_one", "aggregate_100_x_one", "terngrad"]),
    ".venv/bin/tgsim bench sim": (lambda t: _tgsim("bench", "sim", "--quick"),
                                  ["simulator throughput", "peak memory of one step"]),
    # --quick at one point of its grid (N = 2, 1M elements; the whole --quick grid: make test-slow's
    # tests/test_bench_exchange.py)
    ".venv/bin/tgsim bench exchange": (lambda t: _tgsim("bench", "exchange", "--quick", "--ranks", "2", "--params",
                                                        "1e6", "--out", str(t / "bx.csv")),
                                       ["rows: "]),
    ".venv/bin/mpiexec -n 4 .venv/bin/python -m tgsim.mpi_runs.train demo --set workers.n=4":
        (lambda t: [str(BIN / "mpiexec"), "-n", "2", sys.executable, "-m", "tgsim.mpi_runs.train", "demo",
                    "--set", "workers.n=2", "--set", "run.steps=20", "--out", str(t / "mpi"), "--quiet"],
         ["bits/worker up", "(ranks 1..1; rank 0 as server", "(2 ranks)"]),     # -n 4 in tests/test_mpi.py
    ".venv/bin/tgsim run torch_digits --out results/torch-digits":
        (lambda t: _tgsim("run", "torch_digits", "--out", str(t / "torch"), "--set", "run.steps=5", "--quiet"),
         ["test loss", "results: "]),
    ".venv/bin/tgsim run torch_chars --out results/torch-chars":
        (lambda t: _tgsim("run", "torch_chars", "--out", str(t / "chars"), "--set", "run.steps=5",
                          "--set", "data.options.num_samples=400", "--quiet"), ["test loss", "results: "]),
    # run by tests/test_torch_examples.py (--steps 4)
    ".venv/bin/tgsim analyze clipping --quick --model tgsim.torch.examples:mlp --out results/analysis-torch": (None, []),
    ".venv/bin/tgsim bench torch": (None, []),      # its --quick form: tests/test_bench_torch.py
    # its --quick form on examples/ddp_nets.py: tests/test_bench_torch.py::test_quick_run_of_your_model
    "PYTHONPATH=examples .venv/bin/tgsim bench torch --model ddp_nets:digits_net --input-shape 1,8,8": (None, []),
    # examples/ddp_train.py under both launchers (4 steps) and `tgsim run` of its config.toml:
    # tests/test_torch_ddp_example.py
    ".venv/bin/torchrun --nproc-per-node 2 examples/ddp_train.py --codec terngrad --steps 100 "
    "--out results/ddp-digits": (None, []),
    ".venv/bin/mpiexec -n 2 .venv/bin/python examples/ddp_train.py --codec qsgd --steps 100 "
    "--out results/ddp-qsgd": (None, []),
    "PYTHONPATH=examples .venv/bin/tgsim run results/ddp-digits/config.toml --out results/ddp-digits-sim": (None, []),
    # the torch model over MPI equals the simulator bit for bit: tests/test_torch_model.py (one -n 2 job)
    ".venv/bin/mpiexec -n 4 .venv/bin/python -m tgsim.mpi_runs.train torch_digits --out results/torch-digits-mpi":
        (None, []),
    ".venv/bin/tgsim figures least_squares_robbins_monro":
        (lambda t: _tgsim("figures", "--quick", "least_squares_robbins_monro"), [".csv", ".png", "outputs: "]),
    # quick forms run by tests/test_figures.py (the script itself; `tgsim figures` runs it as the line above)
    ".venv/bin/tgsim figures mnist1d_terngrad_vs_fp32": (None, []),
    ".venv/bin/tgsim figures terngrad_sharing_regimes": (None, []),
    ".venv/bin/tgsim figures terngrad_workers_scaling": (None, []),
}


def test_every_readme_command_has_a_quick_form():
    cmds = readme_commands()
    assert len(cmds) >= 10, cmds
    assert set(cmds) == set(QUICK), (f"README commands without a quick form: {sorted(set(cmds) - set(QUICK))}; "
                                     f"quick forms of commands no longer in the README: {sorted(set(QUICK) - set(cmds))}")


def _environment(tmp: Path) -> dict:
    env = {**os.environ, "TGSIM_FIGURES_OUT": str(tmp / "figures"), "MPLBACKEND": "Agg", "CI": "true"}
    env.pop("MAKEFLAGS", None)
    env.pop("MFLAGS", None)
    return env


# the resume line needs the run line's directory: one shared temp dir, commands in README order
@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("readme")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("command", [c for c in readme_commands() if QUICK.get(c, (None,))[0] is not None])
def test_readme_command_runs_in_quick_form(command, workdir):
    make_argv, expected = QUICK[command]
    argv = make_argv(workdir)
    if argv[0] == "make" and shutil.which("make") is None:
        pytest.skip("make is not installed")
    if "exchange" in argv:
        from tgsim.bench import exchange

        ok, why = exchange.check_environment()
        if not ok:
            pytest.skip(f"cannot emulate a network here: {why}")
    proc = subprocess.run(argv, cwd=REPO, env=_environment(workdir), capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{command!r} -> {argv} exited {proc.returncode}:\n{out[-4000:]}"
    for line in expected:
        assert line in out, f"{command!r}: no {line!r} in its output:\n{out[-4000:]}"
    assert "Traceback" not in out, out[-4000:]


def test_readme_python_api_example_runs(tmp_path, monkeypatch):
    """The first Python block of README "Python API" runs as written (in a temporary directory)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Python API"):]
    block = section[section.index("```python\n") + len("```python\n"):]
    block = block[:block.index("```")]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, "README.md (Python API)", "exec"), scope)
    assert set(scope["msg"].codes("fc.w").reshape(-1)) <= {-1, 0, 1}
    assert scope["metrics"].query("split == 'train' and layer == 'model'").step.max() == 200


def test_readme_torch_example_runs(tmp_path):
    """README "Your PyTorch model": its block, split at `# train.py` into mynets.py and train.py, runs
    as written in a temporary directory (20 steps instead of 300) and prints a test accuracy."""
    pytest.importorskip("torch")
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Your PyTorch model"):]
    block = section[section.index("```python\n") + len("```python\n"):]
    block = block[:block.index("```")]
    nets, train = block.split("# train.py\n")
    assert nets.startswith("# mynets.py\n") and '"steps": 300' in train
    (tmp_path / "mynets.py").write_text(nets)
    (tmp_path / "train.py").write_text(train.replace('"steps": 300', '"steps": 20'))
    res = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert 0.0 <= float(res.stdout.strip().splitlines()[-1]) <= 1.0
    assert (tmp_path / "results" / "digits-cnn" / "params.npz").exists()
