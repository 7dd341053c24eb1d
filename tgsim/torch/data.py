"""A user's torch data set as a tgsim Dataset: `[data] name = "torch"`, `options = {factory = ...}`.

    [data]
    name = "torch"
    options = { factory = "mydata:cifar10", kwargs = { root = "~/data" } }

`factory` names a callable as "package.module:function"; it is called with `kwargs` and returns the
training and test sets, either as a pair `(train, test)` of torch Datasets (map-style: `len(ds)` and
`ds[i] -> (x, y)`, e.g. torchvision's CIFAR10 with `transform=ToTensor()`) or as a dict of four
tensors or arrays `{"x_train", "y_train", "x_test", "y_test"}`. The samples are read once, in index
order (a Dataset's transform runs then, once per sample: random augmentations would be frozen, so
give a deterministic transform), into arrays x (n, *sample_shape), int64 where the factory's x are
integers (token ids, kept for an nn.Embedding) and float32 otherwise, and int64 labels y (n,)
(`task = "classification"`, classes = max label + 1 over both splits unless `classes` is given) or
float32 targets (`task = "regression"`). `max_train` / `max_test` (0: all) keep the first rows of
each split. From then on the data is tgsim's: counter-based mini-batches per (seed, step, worker),
sharding, validation hold-out, the same on every MPI rank (each rank calls the factory; the
factory must return the same data on every rank).

A Dataset's samples stay in the shape the factory gives (e.g. (3, 32, 32) for CIFAR-10): the model
factory receives it as `feature_shape` and `dim` = its product, and `TorchModel` feeds the module
batches of that shape. `meta`: the factory, its kwargs, the sample shape and a SHA-256 of the
arrays (`sha256`: `tgsim.data.array_cache.digest`), so two runs can check they trained on the
same bytes.
"""

from __future__ import annotations

import numpy as np

from tgsim.data import array_cache
from tgsim.torch.model import import_torch, resolve_factory

_KEYS = ("x_train", "y_train", "x_test", "y_test")


def _as_numpy(a) -> np.ndarray:
    """A tensor (CPU or not) or array-like as a NumPy array."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def _read_split(ds, limit: int, part: str, factory: str) -> tuple[np.ndarray, np.ndarray]:
    """Every (x, y) of a map-style Dataset, in index order (the first `limit` when limit > 0)."""
    try:
        n = len(ds)
    except TypeError:
        raise ValueError(f"data 'torch': {factory} returned a {part} set without len(): give a map-style "
                         "Dataset (len and ds[i] -> (x, y)) or tensors") from None
    n = min(n, limit) if limit > 0 else n
    if n == 0:
        raise ValueError(f"data 'torch': {factory} returned an empty {part} set")
    xs, ys = [], []
    for i in range(n):
        item = ds[i]
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(f"data 'torch': {factory}'s {part} set item {i} is not an (x, y) pair")
        xs.append(_as_numpy(item[0]))
        ys.append(_as_numpy(item[1]))
    shapes = {x.shape for x in xs}
    if len(shapes) != 1:
        raise ValueError(f"data 'torch': {factory}'s {part} samples have different shapes {sorted(shapes)[:3]}")
    return np.stack(xs), np.stack(ys).reshape(n)


def arrays(factory: str, kwargs: dict | None = None, max_train: int = 0, max_test: int = 0) -> dict:
    """The four arrays of the factory's data (module docstring), not yet cast."""
    try:
        fn = resolve_factory(factory)
    except ValueError as e:
        raise ValueError(str(e).replace("model 'torch'", "data 'torch'")) from None
    import_torch()
    out = fn(**dict(kwargs or {}))
    if isinstance(out, dict):
        missing = [k for k in _KEYS if k not in out]
        if missing:
            raise ValueError(f"data 'torch': {factory} returned a dict without {missing}")
        res = {k: _as_numpy(out[k]) for k in _KEYS}
        for part, limit in (("train", max_train), ("test", max_test)):
            if limit > 0:
                res[f"x_{part}"], res[f"y_{part}"] = res[f"x_{part}"][:limit], res[f"y_{part}"][:limit]
        return res
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ValueError(f"data 'torch': {factory} must return (train, test) Datasets or a dict of "
                         f"{', '.join(_KEYS)}; got {type(out).__name__}")
    (x_tr, y_tr), (x_te, y_te) = (_read_split(out[0], max_train, "training", factory),
                                  _read_split(out[1], max_test, "test", factory))
    return {"x_train": x_tr, "y_train": y_tr, "x_test": x_te, "y_test": y_te}


def load_torch(factory: str, kwargs: dict | None = None, task: str = "classification", classes: int = 0,
               max_train: int = 0, max_test: int = 0) -> dict:
    """The Dataset fields (name aside) of the factory's data: x int64 (integer data) or float32, y int64 labels (or float32
    targets), n_classes, feature_shape, meta. ValueError for data that cannot be one."""
    if task not in ("classification", "regression"):
        raise ValueError(f"data 'torch': task must be 'classification' or 'regression', got {task!r}")
    a = arrays(factory, kwargs, int(max_train), int(max_test))
    if a["x_train"].shape[1:] != a["x_test"].shape[1:]:
        raise ValueError(f"data 'torch': training samples {a['x_train'].shape[1:]} and test samples "
                         f"{a['x_test'].shape[1:]} differ in shape")
    for part in ("train", "test"):
        x, y = a[f"x_{part}"], a[f"y_{part}"]
        if len(x) != len(y):
            raise ValueError(f"data 'torch': x_{part} has {len(x)} rows, y_{part} {len(y)}")
        if x.dtype.kind not in "fiub":
            raise ValueError(f"data 'torch': x_{part} must be numeric, got {x.dtype}")
        a[f"x_{part}"] = x.astype(np.int64 if x.dtype.kind in "iu" else np.float32)   # token ids stay integers
        if not np.isfinite(a[f"x_{part}"]).all():
            raise ValueError(f"data 'torch': x_{part} holds NaN or Inf")
        if task == "classification":
            if y.dtype.kind not in "iu" and not (y.dtype.kind == "f" and np.array_equal(y, np.round(y))):
                raise ValueError(f"data 'torch': classification labels y_{part} must be integers, got {y.dtype}")
            a[f"y_{part}"] = y.astype(np.int64)
            if (a[f"y_{part}"] < 0).any():
                raise ValueError(f"data 'torch': negative label in y_{part}")
        else:
            a[f"y_{part}"] = y.astype(np.float32)
    if task == "classification":
        top = int(max(a["y_train"].max(), a["y_test"].max())) + 1
        n_classes = int(classes) or top
        if n_classes < top:
            raise ValueError(f"data 'torch': classes = {classes}, but a label is {top - 1}")
    else:
        n_classes = 0
    meta = {"factory": factory, "kwargs": dict(kwargs or {}), "sample_shape": list(a["x_train"].shape[1:]),
            "sha256": array_cache.digest(a)}
    return dict(task=task, **a, n_classes=n_classes, feature_shape=tuple(a["x_train"].shape[1:]), meta=meta)
