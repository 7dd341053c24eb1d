"""tgsim.torch.examples' character transformer and `tgsim analyze` on a torch model. The transformer:
its size, the causal mask (a block's output at position t does not move when a later token changes),
the model protocol (each worker's bits those of a call with it alone, gradients against central
differences in float64), bad arguments, and the packaged torch_chars config training below the
unigram loss of its data. The analyses: `tgsim analyze clipping`, bound's per-layer part and the
recorded shapes of unbiasedness and variance with --model name their rows by the module's parameter
names, and analysis/ imports no torch. Skipped,
with the reason, where torch is not installed."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install tgsim[torch])")

from fakes import central_difference_error  # noqa: E402
from tgsim.data.datasets import load as load_data  # noqa: E402
from tgsim.models import make_model  # noqa: E402
from tgsim.torch.examples import char_transformer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHARS = "tgsim.torch.examples:char_transformer"
MLP = "tgsim.torch.examples:mlp"
SMALL = dict(d_model=8, heads=2, layers=2)


def _tokens(rng, n, b, context, vocab):
    return rng.integers(0, vocab, (n, b, context)).astype(np.float32), rng.integers(0, vocab, (n, b))


def test_default_size_and_distinct_layers():
    """At the defaults on pychars' vocabulary: 50k to 100k parameters, the layers drawn each on their own."""
    ds = load_data("pychars", 0, num_samples=100, context=32)
    model = make_model("torch", factory=CHARS, dim=32, classes=ds.n_classes)
    assert 50_000 <= model.num_params <= 100_000
    params = model.init(0)
    assert not np.array_equal(params["blocks.0.linear1.weight"], params["blocks.1.linear1.weight"])


def test_the_mask_is_causal():
    """Changing token t changes the first block's output at positions >= t only."""
    net = char_transformer(12, 20, **SMALL)
    seen = []
    net.blocks[0].register_forward_hook(lambda mod, args, out: seen.append(out.detach()))
    x = torch.randint(0, 20, (3, 12)).float()
    x2 = x.clone()
    x2[:, 7] = (x2[:, 7] + 1) % 20
    with torch.no_grad():
        net(x), net(x2)
    a, b = seen
    assert torch.equal(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_each_worker_gets_the_bits_of_a_call_with_it_alone():
    """N = 3 workers: worker i's loss and gradients equal a call with x[i:i+1] bit for bit."""
    model = make_model("torch", factory=CHARS, dim=10, classes=15, kwargs=SMALL)
    params = model.init(2)
    x, y = _tokens(np.random.default_rng([5, 33]), 3, 4, 10, 15)
    loss, grads = model.loss_and_grad(params, x, y)
    for i in range(3):
        li, gi = model.loss_and_grad(params, x[i:i + 1], y[i:i + 1])
        assert li[0].tobytes() == loss[i].tobytes()
        assert all(gi[k][0].tobytes() == grads[k][i].tobytes() for k in grads), i


def test_gradient_matches_central_differences_float64():
    """float64, 4 coordinates of every parameter: relative error against (L(p+eps) - L(p-eps)) / (2 eps),
    eps = 1e-6, below 1e-5."""
    model = make_model("torch", factory=CHARS, dim=6, classes=7, kwargs=dict(d_model=4, heads=2, layers=1))
    rng = np.random.default_rng(11)
    params = {k: v.astype(np.float64) + 0.1 * rng.standard_normal(v.shape) for k, v in model.init(1).items()}
    x, y = _tokens(rng, 1, 3, 6, 7)
    _, grads = model.loss_and_grad(params, x, y)
    for name in params:
        rel = central_difference_error(model, params, x, y, grads, 0, name, 4, rng)
        assert rel < 1e-5, f"{name}: relative error {rel:.2e}"


@pytest.mark.parametrize("kwargs,match", [
    (dict(d_model=6, heads=4), "multiple of heads"),
    (dict(layers=0), "layers must be"),
    (dict(classes=1), "classes must be"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        char_transformer(**{"dim": 8, "classes": 5, **kwargs})


def test_a_window_of_another_length_is_refused():
    with pytest.raises(ValueError, match=r"\(batch, 8\) token ids"):
        char_transformer(8, 5, **SMALL)(torch.zeros(2, 9))


def test_packaged_config_trains_below_the_unigram_loss(tmp_path):
    """torch_chars (TernGrad, scalers shared as the mean, 4 workers), 60 steps on 4000 windows, seed 0:
    the test loss ends below the unigram loss of the training targets (the best constant prediction)."""
    from tgsim.train.config import load
    from tgsim.train.loop import run

    cfg = load("torch_chars", ["run.steps=60", "run.eval_every=0", "run.checkpoint_every=0",
                               "data.options.num_samples=4000"])
    assert (cfg.data.name, cfg.model.options["factory"], cfg.workers.n) == ("pychars", CHARS, 4)
    result = run(cfg, out=tmp_path / "run", quiet=True)
    unigram = load_data("pychars", 0, num_samples=4000, context=32).meta["unigram_loss"]
    assert result.test_loss < unigram, (result.test_loss, unigram)


# -- tgsim analyze on a torch model --------------------------------------------------------------------------

def test_analyze_clipping_names_rows_by_the_modules_parameters(tmp_path, capsys):
    """`tgsim analyze clipping --model tgsim.torch.examples:mlp`: one row per recorded step, parameter and
    worker, the layers named and sized as the module's parameters; the summary names the factory."""
    from tgsim.cli import main

    assert main(["analyze", "clipping", "--quick", "--steps", "4", "--every", "2", "--model", MLP,
                 "--out", str(tmp_path)]) == 0
    shapes = make_model("torch", factory=MLP, dim=64, classes=10).layer_shapes()
    df = pd.read_csv(tmp_path / "clipping.csv")
    assert sorted(df["layer"].unique()) == sorted(shapes)
    assert {k: int(n) for k, n in df.groupby("layer")["n"].first().items()} == \
        {k: int(np.prod(s)) for k, s in shapes.items()}
    assert len(df) == 2 * 4 * len(shapes)
    assert MLP in capsys.readouterr().out


def test_bound_per_layer_ratios_of_a_torch_model():
    """bound's per-layer part on the torch MLP on wine: rows per module parameter plus the whole model,
    ratios without clipping within [1, sqrt(n)]; the CLI hands --model and --data to `run`."""
    import argparse

    from tgsim.analysis import bound
    from tgsim.analysis.checks_cli import CHECKS, run_kwargs

    df = bound.run(None, seeds=(0,), steps=10, mlp_steps=2, model=MLP, data="wine", quiet=True)["bound_mlp"]
    shapes = make_model("torch", factory=MLP, dim=13, classes=3).layer_shapes()
    assert set(df["layer"]) == set(shapes) | {"model[layerwise]", "model[global]"}
    assert {k: int(n) for k, n in df.groupby("layer")["n"].first().items() if k in shapes} == \
        {k: int(np.prod(s)) for k, s in shapes.items()}          # wine's 13 features, 3 classes
    assert (df["ratio_none"] >= 1 - 1e-9).all() and (df["ratio_none"] <= df["sqrt_n"] * (1 + 1e-9)).all()
    check = next(c for c in CHECKS if c.name == "bound")
    args = argparse.Namespace(quick=True, seeds=None, steps=None, mlp_steps=None, model=MLP, data="wine")
    assert {k: run_kwargs(check, args)[k] for k in ("model", "data")} == {"model": MLP, "data": "wine"}


def test_recorded_gradient_shapes_of_a_torch_model():
    """unbiasedness' and variance's recorded shapes with a model: 'model:<parameter name>' of the module's
    sizes (its trainer gradients on wine, worker 0); the CLI hands --model and --data to both checks."""
    import argparse

    from tgsim.analysis.checks_cli import CHECKS, run_kwargs
    from tgsim.analysis.common import SYNTHETIC_SHAPES, gradient_shapes

    shapes = gradient_shapes(50, 0, recorded_steps=2, model=MLP, data="wine")
    layers = make_model("torch", factory=MLP, dim=13, classes=3).layer_shapes()
    assert {k: v.size for k, v in shapes.items()} == {**{k: 50 for k in SYNTHETIC_SHAPES},
                                                      **{f"model:{k}": int(np.prod(s)) for k, s in layers.items()}}
    for name in ("unbiasedness", "variance"):
        check = next(c for c in CHECKS if c.name == name)
        args = argparse.Namespace(quick=False, **{o.dest: None for o in check.options})
        args.model, args.data = MLP, "wine"
        assert {k: run_kwargs(check, args)[k] for k in ("model", "data")} == {"model": MLP, "data": "wine"}


def test_analysis_imports_no_torch():
    """No module of analysis/ imports torch or tgsim.torch: a torch model reaches it through make_model."""
    for path in sorted((REPO / "analysis").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad = [n for n in names if n.split(".")[0] == "torch" or n.startswith("tgsim.torch")]
            assert not bad, (path.name, bad)


TINY_DATA = '''
import torch


def tiny(n=120):
    """Your own data: 12 N(0, 1) features, 4 classes from the signs of the first two."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n + 40, 12, generator=g)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    return {"x_train": x[:n], "y_train": y[:n], "x_test": x[n:], "y_test": y[n:]}
'''


def test_analyze_takes_a_torch_data_factory(tmp_path, monkeypatch, capsys):
    """`--data package.module:function` trains the analyses' network on your torch data (a config's
    [data] name = "torch", options = {factory = ...}): clipping's rows are the --model's layers sized by
    the factory's 12 features and 4 classes, the summary names the factory; tgsim's MLP records
    gradients of those sizes; `--data torch` without a factory and unknown names are refused."""
    import argparse

    from tgsim.analysis.checks_cli import CHECKS, data_name, run_kwargs
    from tgsim.analysis.common import gradient_shapes, mlp_digits_config
    from tgsim.cli import main

    (tmp_path / "tinydata.py").write_text(TINY_DATA)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = "tinydata:tiny"
    assert main(["analyze", "clipping", "--quick", "--steps", "4", "--every", "2", "--model", MLP, "--data", spec,
                 "--out", str(tmp_path / "out")]) == 0
    shapes = make_model("torch", factory=MLP, dim=12, classes=4).layer_shapes()
    df = pd.read_csv(tmp_path / "out" / "clipping.csv")
    assert sorted(df["layer"].unique()) == sorted(shapes)
    assert {k: int(n) for k, n in df.groupby("layer")["n"].first().items()} == \
        {k: int(np.prod(s)) for k, s in shapes.items()}
    assert f"{MLP} on {spec}" in capsys.readouterr().out
    cfg = mlp_digits_config(data=spec)
    assert (cfg.data.name, cfg.data.options) == ("torch", {"factory": spec})
    got = {k: v.size for k, v in gradient_shapes(50, 0, recorded_steps=2, data=spec).items() if k.startswith("mlp:")}
    assert sorted(got.values()) == sorted([4, 64, 12 * 64, 64 * 4])             # tgsim's MLP, 12 -> 64 -> 4
    check = next(c for c in CHECKS if c.name == "variance")
    args = argparse.Namespace(quick=False, **{o.dest: None for o in check.options})
    args.data = data_name(spec)
    assert run_kwargs(check, args)["data"] == spec
    for bad, message in (("torch", "needs its factory"), ("tinydata", "unknown data set"),
                         ("a:b:c", "package.module:function")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            data_name(bad)
