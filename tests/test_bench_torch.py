"""`tgsim bench torch`: DDP over Gloo at 2 ranks with tgsim's comm hook, DDP's all-reduce and its fp16
hook. The quick run (unshaped loopback, 3 rounds) writes every column, positive finite times and
ratios, the hook's counted bits and DDP's modelled ones; the ratios come from the raw rows as the
module docstring defines them (checked on hand-made rows, no timing); the whole shaped grid is heavy.
Skipped, with the reason, without torch, MPI or (shaped) network namespaces."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (pip install tgsim[torch])")

from tgsim.bench import exchange as be  # noqa: E402
from tgsim.bench import torch_ddp as bt  # noqa: E402
from tgsim.bench.torch_ddp_rank import COLUMNS as RAW_COLUMNS, INPUTS, VARIANTS, hook_config, model_bits  # noqa: E402

OK, WHY = bt.check_launch()
needs_launch = pytest.mark.skipif(not OK, reason=f"cannot launch the DDP ranks here: {WHY}")
NETNS, NETNS_WHY = be.check_environment()
TIMES = ["t_step", "t_forward", "t_backward", "t_optimizer"]


def _raw(rate: str, variant: str, **kw) -> dict:
    row = dict.fromkeys(RAW_COLUMNS, np.nan)
    row.update(rate=rate, variant=variant, ranks=2, params=1000, batch=32, width=16, steps=5, loadavg=0.5, cores=2,
               bits_source="counted" if variant.startswith("tgsim_") else "model")
    row.update(kw)
    return row


def test_ratios_from_raw_rows():
    """hook / backward of `local`, step / step of ddp_allreduce, bits of ddp_allreduce / bits, the target."""
    rows = []
    for rate, scale in (("none", 1.0), ("1gbit", 2.0)):
        rows += [_raw(rate, "local", t_step=0.01 * scale, t_backward=0.006 * scale, t_backward_min=0.005 * scale,
                      t_backward_max=0.007 * scale, t_step_min=0.009, t_step_max=0.011, bits_per_step=0.0),
                 _raw(rate, "ddp_allreduce", t_step=0.02 * scale, t_backward=0.015, t_backward_min=0.014,
                      t_backward_max=0.016, t_step_min=0.019, t_step_max=0.021,
                      bits_per_step=model_bits("ddp_allreduce", 1000, 2)),
                 _raw(rate, "ddp_fp16", t_step=0.018 * scale, t_backward=0.012, t_backward_min=0.012,
                      t_backward_max=0.012, t_step_min=0.018, t_step_max=0.018,
                      bits_per_step=model_bits("ddp_fp16", 1000, 2)),
                 _raw(rate, "tgsim_terngrad", t_step=0.03, t_backward=0.02, t_backward_min=0.019, t_backward_max=0.021,
                      t_hook=0.0006 * scale, t_hook_min=0.0004 * scale, t_hook_max=0.0007 * scale,
                      t_hook_codec=0.00015 * scale, t_hook_comm=0.0004 * scale,
                      t_step_min=0.029, t_step_max=0.031, bits_per_step=2000.0),
                 _raw(rate, "tgsim_fp32", t_step=0.04, t_backward=0.03, t_backward_min=0.03, t_backward_max=0.03,
                      t_hook=0.0012, t_hook_min=0.0012, t_hook_max=0.0012, t_step_min=0.04, t_step_max=0.04,
                      bits_per_step=32000.0)]
    df = bt.summarize(pd.DataFrame(rows)).set_index(["rate", "variant"])
    assert model_bits("ddp_allreduce", 1000, 2) == 32000.0 and model_bits("ddp_fp16", 1000, 4) == 24000.0
    assert df.loc[("none", "tgsim_terngrad"), "hook_over_backward"] == pytest.approx(0.1)
    assert df.loc[("1gbit", "tgsim_terngrad"), "hook_over_backward"] == pytest.approx(0.1)      # same rate's local
    assert df.loc[("none", "tgsim_terngrad"), "hook_over_backward_best"] == pytest.approx(0.08)
    assert df.loc[("none", "tgsim_terngrad"), "codec_over_backward"] == pytest.approx(0.025)      # 0.00015 / 0.006
    assert math.isnan(df.loc[("none", "ddp_allreduce"), "codec_over_backward"])
    assert df.loc[("none", "tgsim_terngrad"), "meets_target"] == "yes"
    assert df.loc[("none", "tgsim_fp32"), "meets_target"] == "NO"                               # 0.2 > 0.1
    assert df.loc[("none", "local"), "meets_target"] == ""
    assert math.isnan(df.loc[("none", "ddp_allreduce"), "hook_over_backward"])
    assert df.loc[("none", "tgsim_fp32"), "comm_over_backward"] == pytest.approx(4.0)                # 0.030 / 0.006 - 1
    assert df.loc[("1gbit", "ddp_allreduce"), "comm_over_backward"] == pytest.approx(0.25)           # 0.015 / 0.012 - 1
    assert math.isnan(df.loc[("none", "local"), "comm_over_backward"])
    assert df.loc[("1gbit", "tgsim_fp32"), "step_vs_allreduce"] == pytest.approx(1.0)
    assert df.loc[("none", "tgsim_fp32"), "step_vs_allreduce"] == pytest.approx(2.0)
    assert df.loc[("none", "tgsim_terngrad"), "bits_ratio"] == pytest.approx(16.0)
    assert math.isnan(df.loc[("none", "local"), "bits_ratio"])
    # exposed communication: step - local's step - own work (the hook's codec; none on DDP's rows), against fp16's
    assert df.loc[("none", "ddp_fp16"), "t_exposed"] == pytest.approx(0.008)                      # 0.018 - 0.010
    assert df.loc[("none", "tgsim_terngrad"), "t_exposed"] == pytest.approx(0.01985)              # 0.03 - 0.01 - 0.00015
    assert df.loc[("none", "tgsim_terngrad"), "exposed_vs_fp16"] == pytest.approx(0.01985 / 0.008)
    assert df.loc[("1gbit", "tgsim_terngrad"), "exposed_vs_fp16"] == pytest.approx(0.0097 / 0.016)  # that rate's
    assert df.loc[("none", "ddp_fp16"), "exposed_vs_fp16"] == pytest.approx(1.0)
    assert math.isnan(df.loc[("none", "local"), "t_exposed"]) and math.isnan(df.loc[("none", "local"), "exposed_vs_fp16"])
    assert df.loc[("none", "tgsim_fp32"), "warning"] == ""
    assert "spread 33 %" in df.loc[("none", "local"), "warning"]       # (max - min) / median of its t_backward


def test_shaped_command_and_bad_options(capsys):
    from tgsim.bench.exchange import NETEM

    cmd = bt.command("1gbit", 2, bt.Path("raw.csv"), bt.Path("store"), 3, 1)
    assert cmd[:2] == ["bash", str(NETEM)] and cmd[cmd.index("--rate") + 1] == "1gbit"
    assert cmd[cmd.index("--module") + 1] == "tgsim.bench.torch_ddp_rank" and cmd[cmd.index("--topology") + 1] == "shared"
    assert cmd[cmd.index("--") + 1:][:2] == ["--store", "store"]
    assert bt.command("none", 2, bt.Path("raw.csv"), bt.Path("store"), 3, 1)[1:3] == ["-n", "2"]
    parser = bt.argparse.ArgumentParser()
    bt.add_arguments(parser)
    assert bt.cmd(parser.parse_args(["--rates", "fast"])) == 2
    assert bt.cmd(parser.parse_args(["--variants", "ddp_allreduce,nccl"])) == 2
    assert "unknown variant(s) ['nccl']" in capsys.readouterr().err


def _check_rows(df: pd.DataFrame, rates: tuple, quick: bool) -> None:
    assert list(df.columns) == RAW_COLUMNS + bt.COLUMNS
    assert sorted(zip(df["rate"], df["variant"])) == sorted((r, v) for r in rates for v in VARIANTS)
    assert (df["quick"] == quick).all()
    assert np.isfinite(df[TIMES].to_numpy(float)).all() and (df[TIMES].to_numpy(float) > 0).all()
    tg = df[df["variant"].str.startswith("tgsim_")]
    for col in ("t_hook", "hook_over_backward", "hook_over_backward_best", "bits_per_step", "t_hook_comm",
                "codec_over_backward"):
        assert np.isfinite(tg[col]).all() and (tg[col] > 0).all(), col
    assert (tg["t_hook_comm"] < tg["t_hook_max"]).all()          # the MPI calls are a part of the hook
    assert tg["meets_target"].isin(["yes", "NO"]).all()
    ok = df[df["variant"] != "local"]
    assert np.isfinite(ok["comm_over_backward"]).all()          # a difference of two timings: either sign
    assert np.isfinite(ok["step_vs_allreduce"]).all() and (ok["step_vs_allreduce"] > 0).all()
    assert np.isfinite(ok["bits_ratio"]).all() and (ok["bits_ratio"] > 0).all()
    ddp = df[df["variant"].str.startswith("ddp_")]
    assert (ddp["bits_source"] == "model").all() and (tg["bits_source"] == "counted").all()
    for r in ddp.itertuples():
        assert r.bits_per_step == model_bits(r.variant, r.params, r.ranks)
    # TernGrad's 2-bit codes send fewer bits than fp32 through the same hook, which sends DDP's float32 count
    for rate in rates:
        bits = df[df["rate"] == rate].set_index("variant")["bits_per_step"]
        assert bits["tgsim_terngrad"] < bits["tgsim_fp32"] / 4


def test_input_reaches_the_rank_program_and_its_config(capsys):
    """`--input cifar10` passes --input to every rank (default digits); the hook's config builds the
    ResNet on the input's channels; an unknown input is refused by the parser (exit 2)."""
    from tgsim.analysis.perfmodel_ddp_validate import bench_resnet_tensors
    from tgsim.torch.examples import resnet

    job = bt.command("none", 2, bt.Path("raw.csv"), bt.Path("store"), 3, 1, image="cifar10")
    assert job[job.index("--input") + 1] == "cifar10"
    job = bt.command("none", 2, bt.Path("raw.csv"), bt.Path("store"), 3, 1)
    assert job[job.index("--input") + 1] == "digits"
    for image, (dim, channels) in INPUTS.items():
        kwargs = hook_config("tgsim_terngrad", 2, 32, 8, image)["model"]["options"]["kwargs"]
        assert kwargs == {"width": 8, "dim": dim, "channels": channels}
        params = sum(p.numel() for p in resnet(dim, 10, **{k: v for k, v in kwargs.items() if k != "dim"})
                     .parameters())
        assert params == sum(e for e, _ in bench_resnet_tensors(8, dim=dim, channels=channels))
    assert INPUTS["cifar10"] == (3 * 32 * 32, 3) and INPUTS["digits"] == (64, 1)
    parser = bt.argparse.ArgumentParser()
    bt.add_arguments(parser)
    assert parser.parse_args([]).input == "digits"
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--input", "imagenet"])
    assert e.value.code == 2 and "invalid choice: 'imagenet'" in capsys.readouterr().err


@needs_launch
@pytest.mark.parametrize("image", ["digits", pytest.param("cifar10", marks=pytest.mark.heavy)])
def test_quick_run_unshaped(tmp_path, capsys, image):
    """One quick run at 2 ranks on the unshaped loopback, per input; the table names every variant
    and the images; the rows hold the input's ResNet (its parameter count) and shape."""
    from tgsim.analysis.perfmodel_ddp_validate import bench_resnet_tensors

    out = tmp_path / "bench_torch.csv"
    df = bt.sweep(out=out, quick=True, image=image, **bt.QUICK)
    assert not df.attrs["failures"]
    back = pd.read_csv(out, keep_default_na=False, na_values=["nan", ""])
    _check_rows(back, ("none",), quick=True)
    dim, channels = INPUTS[image]
    assert (back["input"] == image).all() and (back["dim"] == dim).all() and (back["channels"] == channels).all()
    assert (back["model"] == "tgsim.torch.examples:resnet").all()
    assert (back["params"] == sum(e for e, _ in bench_resnet_tensors(16, dim=dim, channels=channels))).all()
    capsys.readouterr()
    bt.print_table(df)
    text = capsys.readouterr().out
    side = 8 if image == "digits" else 32
    assert text.startswith(bt.QUICK_MARK) and all(v in text for v in VARIANTS)
    assert f"32 {image} images of {channels} x {side}^2 per rank" in text
    bt.print_table(back)                        # read back: DDP's rows have no target verdict, not "nan"
    ddp = [line for line in capsys.readouterr().out.splitlines() if line.split()[1:2] == ["ddp_allreduce"]]
    assert len(ddp) == 1 and "nan" not in ddp[0]


EXAMPLES = bt.Path(__file__).resolve().parents[1] / "examples"
YOURS = {"factory": "ddp_nets:digits_net", "input_shape": (1, 8, 8), "classes": 10}     # examples/ddp_nets.py


def test_your_model_reaches_the_ranks_and_bad_options_are_refused(monkeypatch, capsys):
    """--model, --input-shape and --classes reach every rank's command line; the ResNet's --width with
    --model, --input-shape without it, a factory that does not resolve, a bad shape or one class are
    refused (exit 2) before any rank starts."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    job = bt.command("none", 2, bt.Path("raw.csv"), bt.Path("store"), 3, 1, model=YOURS)
    assert job[job.index("--model") + 1] == "ddp_nets:digits_net" and job[job.index("--classes") + 1] == "10"
    assert job[job.index("--input-shape") + 1] == "1,8,8"
    assert "--model" not in bt.command("none", 2, bt.Path("raw.csv"), bt.Path("store"), 3, 1)
    parser = bt.argparse.ArgumentParser()
    bt.add_arguments(parser)
    assert bt.check_model(parser.parse_args(["--model", "ddp_nets:digits_net", "--input-shape", "1,8,8"])) \
        == YOURS
    for argv, message in ((["--model", "ddp_nets:digits_net", "--width", "8"], "--width is the example ResNet's"),
                          (["--input-shape", "1,8,8"], "--input-shape is for --model"),
                          (["--model", "ddp_nets:no_such_net"], "has no attribute 'no_such_net'"),
                          (["--model", "ddp_nets:digits_net", "--input-shape", "1,8,x"], "positive integers"),
                          (["--model", "ddp_nets:digits_net", "--classes", "1"], "--classes must be >= 2")):
        assert bt.cmd(parser.parse_args(argv)) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_the_ranks_run_in_the_users_environment(monkeypatch, tmp_path):
    """The launch sets no thread variable (OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS,
    NUMBA_NUM_THREADS): none where the user sets none, the user's own value where they set one."""
    seen = []

    class FakeJob:
        returncode = 0
        pid = 0

        def __init__(self, cmd, env, **kw):
            seen.append(dict(env))

        def communicate(self, timeout=None):
            return "", None

    monkeypatch.setattr(bt.subprocess, "Popen", FakeJob)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    assert bt.run_setting("none", 2, tmp_path / "raw.csv", 1, 0) == 0
    assert not [k for k in seen[-1] if "THREADS" in k] and seen[-1]["MPIR_CVAR_NOLOCAL"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    bt.run_setting("none", 2, tmp_path / "raw.csv", 1, 0)
    assert [k for k in seen[-1] if "THREADS" in k] == ["OMP_NUM_THREADS"] and seen[-1]["OMP_NUM_THREADS"] == "3"


@needs_launch
def test_quick_run_of_your_model(tmp_path, capsys, monkeypatch):
    """`tgsim bench torch --quick --model ddp_nets:digits_net --input-shape 1,8,8` (examples/ on
    PYTHONPATH): every column and variant, the rows name the factory and hold its module's parameter
    count and the input shape, no ResNet width; the table names your model."""
    from tgsim.models import make_model

    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("PYTHONPATH", bt.os.pathsep.join([str(EXAMPLES), bt.os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "bench_torch.csv"
    df = bt.sweep(out=out, quick=True, model=YOURS, **bt.QUICK)
    assert not df.attrs["failures"]
    back = pd.read_csv(out, keep_default_na=False, na_values=["nan", ""])
    _check_rows(back, ("none",), quick=True)
    params = make_model("torch", factory=YOURS["factory"], dim=64, classes=10, feature_shape=(1, 8, 8)).num_params
    assert (back["model"] == "ddp_nets:digits_net").all() and (back["params"] == params).all()
    assert (back["input"] == "1x8x8").all() and (back["dim"] == 64).all() and back["width"].isna().all()
    capsys.readouterr()
    bt.print_table(back)
    text = capsys.readouterr().out
    assert f"your model (ddp_nets:digits_net) of {params:,} parameters, 32 N(0, 1) inputs of shape 1x8x8" in text
    assert "ResNet" not in text


@pytest.mark.heavy
@needs_launch
@pytest.mark.skipif(not NETNS, reason=f"cannot shape a network here: {NETNS_WHY}")
def test_full_grid_shaped(tmp_path):
    """The whole grid: unshaped, 10 Gb/s and 1 Gb/s shaped loopback, the full rounds."""
    df = bt.sweep(out=tmp_path / "bench_torch.csv", **bt.FULL)
    assert not df.attrs["failures"] and not df.attrs["skipped"]
    _check_rows(df, bt.FULL["rates"], quick=False)
