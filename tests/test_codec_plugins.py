"""User codecs as plugins: a codec defined outside tgsim/ (examples/plugin_codec/tgsim_example_codec.py)
runs by entry point (group `tgsim.codecs`) or by its import path "module:Class" under `tgsim run`,
`tgsim codecs`, `tgsim analyze unbiasedness --codec`, `tgsim compare variance|bits|speedup|time`, over MPI
(`tgsim.mpi_runs.train`, the simulator's bits) and through tgsim.testing.CodecContract.

The entry point is a real one: a `*.dist-info` folder with an `entry_points.txt` on the path, which
importlib.metadata reads as it reads an installed distribution (tests/test_wheel.py installs the
example with pip into a fresh venv).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tgsim.codecs import registry
from tgsim.errors import ConfigError
from tgsim.testing import CodecContract
from tgsim.train.config import from_dict

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "plugin_codec"
PATH_NAME = "tgsim_example_codec:StochasticBF16"
TGSIM = Path(sys.executable).parent / "tgsim"



@pytest.fixture(autouse=True)
def example_on_path(monkeypatch):
    """examples/plugin_codec on sys.path for each test of this module only: a local build of it may
    declare the entry point sr_bf16, which must not leak into other modules' registry."""
    monkeypatch.syspath_prepend(str(EXAMPLE))


def plugin_site(root: Path, entry_name: str = "sr_bf16") -> Path:
    """A folder that importlib.metadata reads as an installed distribution declaring the example codec
    as the entry point `entry_name` of the group tgsim.codecs (the module beside it)."""
    site = root / "site"
    info = site / "tgsim_example_codec-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tgsim-example-codec\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[tgsim.codecs]\n{entry_name} = {PATH_NAME}\n")
    shutil.copy(EXAMPLE / "tgsim_example_codec.py", site)
    return site


def tgsim(args: list[str], cwd: Path, pythonpath: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([str(TGSIM), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# -- the registry ----------------------------------------------------------------------------------------

def test_import_path_resolves_to_the_class():
    import tgsim_example_codec

    assert registry.codec_class(PATH_NAME) is tgsim_example_codec.StochasticBF16
    cfg = from_dict({"codec": {"name": PATH_NAME}, "exchange": {"mode": "ps"}})
    assert registry.make_codec(cfg.codec).name == "sr_bf16"


@pytest.mark.parametrize("name, message", [
    ("no_such_codec", "unknown codec 'no_such_codec'; expected one of fp32, "),
    ("no_such_module_xyz:Codec", "cannot import module 'no_such_module_xyz'"),
    ("tgsim_example_codec:Missing", "has no attribute 'Missing'"),
    ("tgsim_example_codec:BF16Message", "has no from_config"),
    (":Codec", "must read 'package.module:Class'"),
])
def test_bad_names_are_one_clear_error(name, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        registry.codec_class(name)
    with pytest.raises(ConfigError, match=r"^\[codec\] "):
        from_dict({"codec": {"name": name}})


def test_entry_point_is_found_listed_and_built(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_site(tmp_path)))
    assert registry.plugins() == {"sr_bf16": PATH_NAME}
    assert registry.names()[-1] == "sr_bf16" and registry.names()[:len(registry.CODECS)] == tuple(registry.CODECS)
    codec = registry.make_codec(from_dict({"codec": {"name": "sr_bf16"}, "exchange": {"mode": "ps"}}).codec)
    assert type(codec).__name__ == "StochasticBF16"


def test_a_plugin_named_like_a_builtin_is_shadowed(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_site(tmp_path, entry_name="fp32")))
    assert "fp32" not in registry.plugins()
    assert registry.codec_class("fp32").__module__ == "tgsim.codecs.fp32"


# -- the contract, as a user's CI runs it ---------------------------------------------------------------

class TestExamplePluginContract(CodecContract):
    @pytest.fixture
    def codec(self):
        return registry.codec_class(PATH_NAME)()


# -- the commands --------------------------------------------------------------------------------------

def test_codecs_and_run_by_entry_point(tmp_path):
    site = plugin_site(tmp_path)
    listing = tgsim(["codecs"], tmp_path, site)
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.splitlines() if line.startswith("sr_bf16 "))
    assert "plugin" in row and PATH_NAME in row and " True " in row      # unbiased, as declared
    res = tgsim(["run", str(REPO / "tgsim/configs/demo.toml"), "--out", "run", "--quiet", "--set", "run.steps=12",
                 "--set", "run.eval_every=0", "--set", "codec.name='sr_bf16'", "--set", "exchange.mode='ps'"],
                tmp_path, site)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "run" / "params.npz").exists()
    assert "name = \"sr_bf16\"" in (tmp_path / "run" / "config.toml").read_text()


def test_analyze_unbiasedness_takes_a_plugin(tmp_path):
    res = tgsim(["analyze", "unbiasedness", "--quick", "--codec", PATH_NAME, "--out", "a"], tmp_path, EXAMPLE)
    assert res.returncode == 0, res.stderr
    import pandas as pd

    row = pd.read_csv(next((tmp_path / "a").glob("unbiasedness_codecs*.csv"))).iloc[0]
    assert row.codec == PATH_NAME and bool(row.declared_unbiased) and bool(row.consistent)


def test_compare_variance_takes_a_plugin(tmp_path):
    """The plugin's "sweep" option (mantissa_bits 3, 5, 7) is its knob: at 16 bits the least-error
    value, 7, is taken (no exact formula: the mean error over 4 seeds decides); a label that fixes it
    at 3 bits has the larger error."""
    import pandas as pd

    res = tgsim(["compare", "variance", "--quick", "--codecs", f"fp16,{PATH_NAME},{PATH_NAME}[mantissa_bits=3]",
                 "--kinds", "gaussian", "--out", "cv"], tmp_path, EXAMPLE, timeout=300)
    assert res.returncode == 0, res.stderr
    df = pd.read_csv(tmp_path / "cv" / "variance.csv")
    ok = df[(df.codec == PATH_NAME) & (df.status == "ok")]
    assert len(ok) and (ok.budget == 16.0).all() and ok.exact_mse.isna().all() and ok.p_value.isna().all()
    assert (ok.knob == "mantissa_bits=7").all()
    # stochastic rounding to 8 mantissa bits: larger error than fp16's rounding to 11, both measured
    fp16 = df[(df.codec == "fp16") & (df.status == "ok") & (df.workers == 1)].rel_mse.iloc[0]
    assert ok[ok.workers == 1].rel_mse.iloc[0] > fp16 > 0
    three = df[(df.codec == f"{PATH_NAME}[mantissa_bits=3]") & (df.status == "ok") & (df.workers == 1)]
    assert (three.knob.fillna("") == "").all()
    assert three.rel_mse.iloc[0] > 4 * ok[ok.workers == 1].rel_mse.iloc[0]


def test_compare_bits_knows_a_plugin():
    from tgsim.analysis import compare_bits as cb

    assert cb.method_sections(PATH_NAME) == ({"name": PATH_NAME}, {})
    assert cb.method_sections(PATH_NAME + "+ef") == ({"name": PATH_NAME, "error_feedback": True}, {})
    assert cb.method_sections(PATH_NAME + "[mantissa_bits=5]") == ({"name": PATH_NAME, "mantissa_bits": 5}, {})
    assert cb.method_sections("terngrad[sharing=mean]") == ({"name": "terngrad", "sharing": "mean"}, {})
    with pytest.raises(ValueError, match="method 'nosuch': unknown codec 'nosuch'"):
        cb.method_sections("nosuch")
    with pytest.raises(ValueError, match=f"codec '{PATH_NAME}' has no option 'levels'"):
        cb.method_sections(PATH_NAME + "[levels=3]")
    cfg = cb.config(cb.PROBLEMS["logistic"], PATH_NAME, seed=0, steps=5)
    assert cfg.codec.name == PATH_NAME


def test_compare_speedup_knows_a_plugin():
    from tgsim.analysis import compare_speedup as cs

    assert cs.method_sections(PATH_NAME) == ({"name": PATH_NAME}, {})
    assert cs.method_sections("qsgd[levels=7]+pqasgd") == ({"name": "qsgd", "levels": 7},
                                                           {"local": "pqasgd", "every": 4})
    assert cs.default_sweeps([PATH_NAME]) == {PATH_NAME: ("mantissa_bits", (3, 5, 7))}
    with pytest.raises(ValueError, match="method 'nosuch'"):
        cs.method_sections("nosuch")
    cfg = cs.config(cs.Problem(n=4096), 2, PATH_NAME, seed=0, steps=5)
    assert cfg.codec.name == PATH_NAME and cfg.workers.n == 2


def test_an_installed_plugin_joins_every_comparison(tmp_path, monkeypatch):
    """Installed by entry point, the plugin is in every comparison's default list, its "sweep" option
    is its knob in compare variance and speedup, and it runs in compare variance and compare bits
    (small forms: 2^10 elements, R = 3; logistic regression, 8 steps, no tuning), with no edit to tgsim."""
    from tgsim.analysis import common, compare_bits as cb, compare_speedup as cs, compare_variance as cv

    monkeypatch.syspath_prepend(str(plugin_site(tmp_path)))
    assert "sr_bf16" in cv.default_codecs() and "sr_bf16" in cb.default_methods()
    assert "sr_bf16" in common.default_methods() and "sr_bf16" in cs.default_methods()
    assert cv.spec("sr_bf16").knobs == {"mantissa_bits": (3, 5, 7)}
    assert cs.default_sweeps(cs.default_methods())["sr_bf16"] == ("mantissa_bits", (3, 5, 7))
    df = cv.run(None, kinds=("gaussian",), n=1 << 10, R=3, workers=(1, 8), quiet=True)["variance"]
    mine = df[(df.codec == "sr_bf16") & (df.status == "ok")]
    assert set(mine.knob) == {"mantissa_bits=7"} and set(mine.budget) == {16.0}
    problem = dataclasses.replace(cb.PROBLEMS["logistic"], steps=8)
    runs = cb.run(None, problems=(problem,), seeds=(0,), lr_grid=(), window=2, quiet=True)["bits_runs"]
    assert set(runs.method) == set(cb.default_methods())
    row = runs[runs.method == "sr_bf16"].iloc[0]
    assert row.bits_up_per_element > 16 and np.isfinite(row.loss_smoothed)


def test_compare_cli_refuses_an_unknown_method_in_one_line(tmp_path):
    for what, flag in (("speedup", "--methods"), ("bits", "--methods"), ("variance", "--codecs")):
        res = tgsim(["compare", what, "--quick", flag, "nosuch:Codec", "--out", "x"], tmp_path, EXAMPLE)
        assert res.returncode != 0 and "cannot import module 'nosuch'" in res.stderr, (what, res.stderr)
        assert "Traceback" not in res.stderr


# -- MPI: every rank imports the plugin; the simulator's bits --------------------------------------------

def test_plugin_over_mpi_equals_the_simulator(tmp_path):
    sys.path.insert(0, str(REPO / "tests"))
    import mpi_launch

    if not mpi_launch.DEFAULT.ok:
        pytest.skip(mpi_launch.DEFAULT.skip_reason())
    import tomli_w

    from tgsim.train.loop import run

    d = {"run": {"seed": 5, "steps": 20, "eval_every": 0, "checkpoint_every": 0, "log_every": 10},
         "data": {"name": "least_squares"}, "model": {"name": "least_squares"}, "workers": {"n": 2, "batch": 16},
         "codec": {"name": PATH_NAME}, "exchange": {"mode": "ps"}, "optimizer": {"name": "momentum"},
         "schedule": {"name": "constant", "lr": 0.05}}
    (tmp_path / "c.toml").write_bytes(tomli_w.dumps(d).encode())
    job = mpi_launch.DEFAULT.run([(2, ["-m", "tgsim.mpi_runs.train", str(tmp_path / "c.toml"), "--out",
                                       str(tmp_path / "mpi"), "--quiet"])], 90,
                                 PYTHONPATH=os.pathsep.join([str(REPO), str(EXAMPLE)]))
    assert job.returncode == 0, job.report()
    sim = run(from_dict(d), out=tmp_path / "sim", quiet=True)
    with np.load(tmp_path / "mpi" / "params.npz") as z:
        assert {k: z[k].tobytes() for k in z.files} == {k: np.asarray(v).tobytes() for k, v in sim.params.items()}
