"""tgsim.torch.data: a user's torch data set as tgsim's `[data] name = "torch"`.

(train, test) map-style Datasets of image tensors keep their sample shape and reach a TorchModel as
`feature_shape`; a dict of tensors works too; the arrays equal the factory's samples bit for bit and
their SHA-256 is in `meta`; a run trains on it through tgsim's trainer. Bad factories and data give
clear errors before any step."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tgsim.data import load  # noqa: E402
from tgsim.errors import ConfigError  # noqa: E402
from tgsim.train.config import from_dict  # noqa: E402
from tgsim.train.loop import run  # noqa: E402

HERE = "test_torch_data"          # tests/ is on sys.path: the factories below are "test_torch_data:..."


def _images(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 6, 6, generator=g)
    y = (x.mean(dim=(1, 2, 3)) > 0).long() + 2 * (x[:, 0, 0, 0] > 0).long()     # 4 learnable classes
    return x, y


def images():
    """(train, test) TensorDatasets of 1 x 6 x 6 images, 4 classes."""
    return (torch.utils.data.TensorDataset(*_images(96, 0)), torch.utils.data.TensorDataset(*_images(32, 1)))


def tensors(scale=1.0):
    (x, y), (xt, yt) = _images(96, 0), _images(32, 1)
    return {"x_train": x * scale, "y_train": y, "x_test": xt * scale, "y_test": yt}


def conv(feature_shape, classes):
    """A factory that reads the data's sample shape."""
    c, h, w = feature_shape
    return torch.nn.Sequential(torch.nn.Conv2d(c, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * h * w, classes))


def odd_shapes():
    return ([(torch.zeros(1, 6, 6), 0), (torch.zeros(1, 5, 6), 1)], [(torch.zeros(1, 6, 6), 0)])


def float_labels():
    d = tensors()
    d["y_train"] = d["y_train"].float() + 0.5
    return d


def with_nan():
    d = tensors()
    d["x_test"][3, 0, 0, 0] = float("nan")
    return d


def test_datasets_keep_their_shape_and_bits():
    ds = load("torch", factory=f"{HERE}:images")
    x, y = _images(96, 0)
    assert ds.feature_shape == (1, 6, 6) and ds.n_classes == 4 and ds.task == "classification"
    assert ds.x_train.dtype == np.float32 and ds.x_train.tobytes() == x.numpy().tobytes()
    assert ds.y_train.dtype == np.int64 and np.array_equal(ds.y_train, y.numpy())
    assert ds.n_test == 32
    same = load("torch", factory=f"{HERE}:tensors")          # the dict form of the same data
    assert same.meta["sha256"] == ds.meta["sha256"] and ds.meta["sample_shape"] == [1, 6, 6]
    other = load("torch", factory=f"{HERE}:tensors", kwargs={"scale": 2.0})
    assert other.meta["sha256"] != ds.meta["sha256"]
    assert load("torch", factory=f"{HERE}:images", max_train=10, max_test=5).n_train == 10


def test_a_run_trains_on_it_with_the_shape_reaching_the_model(tmp_path):
    cfg = from_dict({"run": {"steps": 30, "eval_every": 0, "log_every": 10, "checkpoint_every": 0},
                     "data": {"name": "torch", "options": {"factory": f"{HERE}:images"}},
                     "model": {"name": "torch", "options": {"factory": f"{HERE}:conv"}},
                     "workers": {"n": 2, "batch": 16}, "codec": {"name": "terngrad"}, "exchange": {"mode": "ps"},
                     "optimizer": {"name": "momentum"}, "schedule": {"name": "constant", "lr": 0.05}})
    res = run(cfg, out=tmp_path / "r", quiet=True)
    with np.load(tmp_path / "r" / "params.npz") as z:
        assert z["0.weight"].shape == (4, 1, 3, 3) and z["3.weight"].shape == (4, 4 * 36)
    assert np.isfinite(res.test_accuracy) and res.test_accuracy > 0.25       # above chance (4 classes)


@pytest.mark.parametrize("options,match", [
    ({}, "give options.factory"),
    ({"factory": "no_such_module:data"}, "data 'torch': factory 'no_such_module:data': cannot import"),
    ({"factory": f"{HERE}:odd_shapes"}, "samples have different shapes"),
    ({"factory": f"{HERE}:float_labels"}, "labels y_train must be integers"),
    ({"factory": f"{HERE}:with_nan"}, "x_test holds NaN"),
    ({"factory": f"{HERE}:images", "classes": 3}, "classes = 3, but a label is 3"),
    ({"factory": f"{HERE}:images", "task": "ranking"}, "task must be"),
])
def test_bad_factories_and_data_are_clear_errors(options, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        load("torch", **options)
    cfg = from_dict({"run": {"steps": 2}, "data": {"name": "torch", "options": options},
                     "model": {"name": "torch", "options": {"factory": f"{HERE}:conv"}},
                     "workers": {"n": 2, "batch": 4}})
    with pytest.raises(ConfigError, match=match):           # through the trainer: before any step
        run(cfg, out=tmp_path / "r", quiet=True)
    assert not (tmp_path / "r" / "params.npz").exists()
