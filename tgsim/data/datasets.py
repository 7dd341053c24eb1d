"""Datasets that need no download: synthetic problems, scikit-learn's bundled sets, MNIST-1D, and
next-byte windows of the Python standard library's source.

`load(name, seed=0, **kwargs)` returns a `Dataset` with x float32 and y int64 labels
(classification) or float32 targets (regression). Every loader is a pure function of
(name, seed, kwargs): two calls with the same arguments give identical arrays.

Names and their keyword arguments (defaults in parentheses):

* ``"least_squares"`` -- n (1024), n_test (256), dim (32), noise (0.1), cond (100.0),
  rotate (False). Rows are ``x = z * s`` (optionally ``@ Q.T``) with ``z ~ N(0, I_dim)`` and the
  geometric spectrum ``s_i = cond ** (-i / (2 (dim - 1)))``, i = 0..dim-1, running from 1 to
  ``1/sqrt(cond)``. The population covariance ``E[x x^T] = diag(s^2)`` -- the Hessian of the
  expected loss ``E (x.w - y)^2 / 2`` -- therefore has eigenvalues from 1 to ``1/cond``: ``cond``
  is its condition number. ``rotate=True`` applies a random orthogonal ``Q`` so the ill-conditioned
  directions are not coordinate axes (this matters for per-coordinate quantizers such as TernGrad).
  Targets ``y = x.w_true + noise * e``, ``w_true ~ N(0, I_dim)``, ``e ~ N(0, 1)``.
  ``meta``: w_true, spectrum, rotation (or None), cond, noise, w_star (the least-squares minimiser
  on the training set, float64) and loss_star (the training loss ``mean((X w_star - y)^2) / 2`` at
  it).
* ``"classification"`` -- n (2000), n_test (500), dim (20), classes (4), separation (3.0).
  Class ``k`` has mean ``mu_k = separation * u_k`` with ``u_k`` a uniformly random unit vector,
  and ``x = mu_y + N(0, I_dim)``. Labels are balanced (``i mod classes``) then shuffled.
  ``meta``: means.
* ``"digits"`` (1797 x 64, 10 classes), ``"breast_cancer"`` (569 x 30, 2 classes: 0 malignant,
  1 benign), ``"wine"`` (178 x 13, 3 classes) -- scikit-learn's bundled copies (shipped inside the
  package; nothing is downloaded). test_fraction (0.25), standardize (True). The train/test split
  is stratified and keyed by ``seed``; features are standardised with the training mean and
  standard deviation (a feature that is constant on the training set is divided by 1).
  ``meta``: target_names, feature_names, mean, std.
* ``"mnist1d"`` -- num_samples (5000; a multiple of 10), generator_seed (42). Generated offline by
  ``mnist1d.data.make_dataset`` (Greydanus 2020); ``get_dataset`` is never called, so nothing is
  downloaded. The generator seeds NumPy's and Python's global RNGs: both are saved and restored
  around it. The split is the generator's own (first 80 % train): 4000 / 1000 for 5000 samples.
  ``seed`` does not affect this dataset; ``generator_seed=42`` is the canonical MNIST-1D.
  Generated arrays are cached in memory (``functools.lru_cache``) and on disk
  (`tgsim.data.array_cache`: ``$TGSIM_CACHE_DIR``, else ``~/.cache/tgsim``, checked by SHA-256 on
  every read; ``TGSIM_CACHE_DIR=off`` disables it), keyed by the mnist1d package's version,
  num_samples and generator_seed; the cached arrays equal the generated ones bit for bit.
  ``meta``: generation_seconds (generating or reading them), cache (the file, or None).

* ``"pychars"`` -- num_samples (20000), context (32), test_fraction (0.2). Next-byte prediction
  on a real text corpus present on every machine: the source of a fixed sorted list of the Python
  standard library's modules (``PYCHARS_MODULES``, read from ``sysconfig.get_paths()["stdlib"]``),
  concatenated in that order as bytes. Tokens are indices into the corpus' sorted set of distinct
  byte values (the vocabulary, ``n_classes`` of them). A sample's x is a window of ``context``
  consecutive tokens (float32 token ids, exact below 2^24), its y (int64) the token after the
  window. The corpus is cut into blocks of ``PYCHARS_BLOCK`` tokens; round(test_fraction * blocks)
  of them, drawn keyed by ``seed``, hold the test windows and the rest the training windows, so no
  window or target of one split overlaps the other. round(test_fraction * num_samples) test and the
  other training windows (window and target inside one block) are drawn without replacement,
  keyed by ``seed``. The corpus, and so the data, changes with the Python version: ``meta`` records
  python_version, stdlib (the directory read), modules, sha256 (of the corpus bytes), corpus_bytes,
  vocab (the byte values of the tokens 0..n_classes-1), unigram_loss (the entropy, in nats, of
  the training targets' distribution: the cross-entropy of the best constant prediction), and
  train_starts / test_starts (each window's offset in the corpus, int64; the loader's splits, before
  any validation hold-out).
* ``"torch"`` -- factory (required, "package.module:function"), kwargs (None), task
  ("classification"), classes (0: max label + 1), max_train (0: all), max_test (0: all). A user's
  torch data set (``tgsim.torch.data``; needs the ``torch`` extra): the factory returns (train,
  test) map-style torch Datasets of (x, y) or a dict of x_train, y_train, x_test, y_test; the
  samples are read once, in index order, keeping their shape (``feature_shape``, e.g. (3, 32, 32)).
  ``seed`` does not affect it. ``meta``: factory, kwargs, sample_shape, sha256 (of the arrays).

Every name also takes ``validation`` (0.0): a fraction of the training split held out, stratified
by label for classification (``validation_stratify = false``: a plain seeded draw, for labels seen
once, e.g. pychars' rare bytes) and keyed by ``seed``, that replaces the test split for the run
(``Dataset.eval_split == "validation"``; the test arrays are not returned at all). Tune
hyper-parameters on it, then report test accuracy from runs with ``validation=0``. The held-out
rows come from the loader's training arrays as returned (for the scikit-learn sets, after
standardisation with the statistics of the whole training split).
"""

from __future__ import annotations

import functools
import inspect
import random
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tgsim.data import array_cache

# Tags that separate the random streams of the different loaders (any distinct constants).
_TAG_LEAST_SQUARES = 0x4C535131
_TAG_CLASSIFICATION = 0x434C5331
_TAG_SPLIT = 0x53504C31
_TAG_VALIDATION = 0x56414C31
_TAG_PYCHARS = 0x50594331


@dataclass(eq=False)
class Dataset:
    """A train/test pair of arrays and what they are.

    x arrays are float32 (or int64 token ids, from a torch data factory: tgsim/torch/data.py) of shape
    (n, *feature_shape); y arrays are int64 labels in
    [0, n_classes) for task "classification" and float32 targets for task "regression"
    (n_classes == 0).
    """

    name: str
    task: str
    x_train: np.ndarray = field(repr=False)
    y_train: np.ndarray = field(repr=False)
    x_test: np.ndarray = field(repr=False)
    y_test: np.ndarray = field(repr=False)
    n_classes: int
    feature_shape: tuple[int, ...]
    meta: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.task not in ("regression", "classification"):
            raise ValueError(f"task must be 'regression' or 'classification', got {self.task!r}")
        self.feature_shape = tuple(int(d) for d in self.feature_shape)
        for part in ("train", "test"):
            x, y = getattr(self, f"x_{part}"), getattr(self, f"y_{part}")
            if x.dtype not in (np.float32, np.int64):
                raise ValueError(f"x_{part} must be float32 (or int64 token ids), got {x.dtype}")
            if x.shape[1:] != self.feature_shape:
                raise ValueError(f"x_{part} has shape {x.shape}, features {self.feature_shape}")
            if y.shape != (x.shape[0],):
                raise ValueError(f"y_{part} has shape {y.shape}, expected ({x.shape[0]},)")
            want = np.int64 if self.task == "classification" else np.float32
            if y.dtype != want:
                raise ValueError(
                    f"y_{part} must be {np.dtype(want)} for {self.task}, got {y.dtype}")

    @property
    def eval_split(self) -> str:
        """'test', or 'validation' when x_test/y_test hold rows held out of the training split."""
        return str(self.meta.get("eval_split", "test"))

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.x_test.shape[0])

    def __repr__(self) -> str:
        return (f"Dataset(name={self.name!r}, task={self.task!r}, n_train={self.n_train}, "
                f"n_test={self.n_test}, n_classes={self.n_classes}, "
                f"feature_shape={self.feature_shape})")


# ---------------------------------------------------------------------------------------------
# argument checks

def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_float(name: str, value, minimum: float, *, strict: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not np.isfinite(v) or v < minimum or (strict and v == minimum):
        op = ">" if strict else ">="
        raise ValueError(f"{name} must be finite and {op} {minimum}, got {value!r}")
    return v


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


# ---------------------------------------------------------------------------------------------
# synthetic

def _least_squares(seed: int, *, n: int = 1024, n_test: int = 256, dim: int = 32,
                   noise: float = 0.1, cond: float = 100.0, rotate: bool = False) -> Dataset:
    n, n_test, dim = (_check_int("n", n, 1), _check_int("n_test", n_test, 1),
                      _check_int("dim", dim, 1))
    noise = _check_float("noise", noise, 0.0)
    cond = _check_float("cond", cond, 1.0)
    if not isinstance(rotate, (bool, np.bool_)):
        raise ValueError(f"rotate must be a bool, got {rotate!r}")
    rng = np.random.default_rng([_TAG_LEAST_SQUARES, seed])
    expo = np.arange(dim) / (dim - 1) if dim > 1 else np.zeros(1)
    spectrum = cond ** (-expo / 2.0)
    rotation = None
    if rotate:
        q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
        rotation = q * np.sign(np.diag(r))          # Haar-distributed orthogonal matrix
    w_true = rng.standard_normal(dim)

    def draw(m):
        x = rng.standard_normal((m, dim)) * spectrum
        if rotation is not None:
            x = x @ rotation.T
        y = x @ w_true + noise * rng.standard_normal(m)
        return x.astype(np.float32), y.astype(np.float32)

    x_tr, y_tr = draw(n)
    x_te, y_te = draw(n_test)
    xd, yd = x_tr.astype(np.float64), y_tr.astype(np.float64)
    w_star = np.linalg.lstsq(xd, yd, rcond=None)[0]
    loss_star = float(np.mean((xd @ w_star - yd) ** 2) / 2.0)
    meta = dict(w_true=w_true, spectrum=spectrum, rotation=rotation, cond=cond, noise=noise,
                w_star=w_star, loss_star=loss_star)
    return Dataset("least_squares", "regression", x_tr, y_tr, x_te, y_te, 0, (dim,), meta)


def _classification(seed: int, *, n: int = 2000, n_test: int = 500, dim: int = 20,
                    classes: int = 4, separation: float = 3.0) -> Dataset:
    n, n_test, dim = (_check_int("n", n, 1), _check_int("n_test", n_test, 1),
                      _check_int("dim", dim, 1))
    classes = _check_int("classes", classes, 2)
    separation = _check_float("separation", separation, 0.0)
    rng = np.random.default_rng([_TAG_CLASSIFICATION, seed])
    u = rng.standard_normal((classes, dim))
    means = separation * u / np.linalg.norm(u, axis=1, keepdims=True)

    def draw(m):
        y = rng.permutation(np.arange(m) % classes).astype(np.int64)
        x = means[y] + rng.standard_normal((m, dim))
        return x.astype(np.float32), y

    x_tr, y_tr = draw(n)
    x_te, y_te = draw(n_test)
    return Dataset("classification", "classification", x_tr, y_tr, x_te, y_te, classes, (dim,),
                   dict(means=means, separation=separation))


# ---------------------------------------------------------------------------------------------
# scikit-learn bundled sets

def _sklearn(name: str, seed: int, *, test_fraction: float = 0.25,
             standardize: bool = True) -> Dataset:
    test_fraction = _check_float("test_fraction", test_fraction, 0.0, strict=True)
    if not isinstance(standardize, (bool, np.bool_)):
        raise ValueError(f"standardize must be a bool, got {standardize!r}")
    if test_fraction >= 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn import datasets as skd
    from sklearn.model_selection import train_test_split

    bunch = getattr(skd, f"load_{name}")()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    try:
        x_tr, x_te, y_tr, y_te = train_test_split(
            x, y, test_size=test_fraction, stratify=y,
            random_state=int(np.random.SeedSequence([_TAG_SPLIT, seed]).generate_state(1)[0]))
    except ValueError as e:  # e.g. a test set smaller than the number of classes
        raise ValueError(f"{name}: cannot split with test_fraction={test_fraction}: {e}") from None
    mean = x_tr.mean(axis=0)
    std = x_tr.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    if standardize:
        x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    n_classes = int(len(bunch.target_names))
    meta = dict(target_names=list(map(str, bunch.target_names)),
                feature_names=list(map(str, getattr(bunch, "feature_names", []))),
                mean=mean, std=std, standardized=bool(standardize))
    return Dataset(name, "classification", x_tr.astype(np.float32), y_tr, x_te.astype(np.float32),
                   y_te, n_classes, (x.shape[1],), meta)


# ---------------------------------------------------------------------------------------------
# MNIST-1D

def _mnist1d_generate(num_samples: int, generator_seed: int) -> dict[str, np.ndarray]:
    """Run the MNIST-1D generator offline, global RNG states restored; arrays x, y, x_test, y_test."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = generator_seed
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return {"x": np.asarray(d["x"], dtype=np.float32), "y": np.asarray(d["y"], dtype=np.int64),
            "x_test": np.asarray(d["x_test"], dtype=np.float32), "y_test": np.asarray(d["y_test"], dtype=np.int64)}


@functools.lru_cache(maxsize=8)
def _mnist1d_arrays(num_samples: int, generator_seed: int):
    """MNIST-1D's arrays from the disk cache (tgsim.data.array_cache, keyed by the mnist1d package's
    version, num_samples and generator_seed) or generated; read-only (x, y, x_test, y_test, seconds,
    cache path or None)."""
    import time
    from importlib.metadata import version

    key = f"mnist1d-{version('mnist1d')}-n{num_samples}-seed{generator_seed}"
    t0 = time.perf_counter()
    arrays, path = array_cache.cached(key, lambda: _mnist1d_generate(num_samples, generator_seed))
    seconds = time.perf_counter() - t0
    out = tuple(arrays[k] for k in ("x", "y", "x_test", "y_test"))
    for a in out:
        a.flags.writeable = False
    return out + (seconds, None if path is None else str(path))


def _mnist1d(seed: int, *, num_samples: int = 5000, generator_seed: int = 42) -> Dataset:
    num_samples = _check_int("num_samples", num_samples, 20)
    if num_samples % 10:
        raise ValueError(f"num_samples must be a multiple of 10 (10 classes), got {num_samples}")
    generator_seed = _check_int("generator_seed", generator_seed, 0)
    x_tr, y_tr, x_te, y_te, seconds, path = _mnist1d_arrays(num_samples, generator_seed)
    meta = dict(generator_seed=generator_seed, num_samples=num_samples,
                generation_seconds=seconds, cache=path)
    return Dataset("mnist1d", "classification", x_tr.copy(), y_tr.copy(), x_te.copy(),
                   y_te.copy(), 10, (x_tr.shape[1],), meta)


# ---------------------------------------------------------------------------------------------
# Python standard library source as a text corpus

PYCHARS_MODULES: tuple[str, ...] = (
    "argparse.py", "dataclasses.py", "difflib.py", "fractions.py", "functools.py", "heapq.py",
    "inspect.py", "random.py", "shutil.py", "statistics.py", "textwrap.py", "typing.py")
PYCHARS_BLOCK = 1024      # tokens per block of the train/test split


@functools.lru_cache(maxsize=2)
def _pychars_corpus(stdlib: str) -> bytes:
    """The bytes of PYCHARS_MODULES under `stdlib`, concatenated in order; ValueError naming a
    missing file."""
    import os

    parts = []
    for name in PYCHARS_MODULES:
        path = os.path.join(stdlib, name)
        try:
            with open(path, "rb") as f:
                parts.append(f.read())
        except OSError as e:
            raise ValueError(f"pychars: cannot read the standard library module {path!r} ({e}); "
                             "this Python installation lacks its source files") from None
    return b"".join(parts)


def _pychars(seed: int, *, num_samples: int = 20000, context: int = 32,
             test_fraction: float = 0.2) -> Dataset:
    import hashlib
    import platform
    import sysconfig

    num_samples = _check_int("num_samples", num_samples, 2)
    context = _check_int("context", context, 1)
    test_fraction = _check_float("test_fraction", test_fraction, 0.0, strict=True)
    if test_fraction >= 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if context >= PYCHARS_BLOCK:
        raise ValueError(f"context must be < {PYCHARS_BLOCK} (the split's block length), got {context}")
    stdlib = sysconfig.get_paths()["stdlib"]
    corpus = _pychars_corpus(stdlib)
    raw = np.frombuffer(corpus, dtype=np.uint8)
    vocab, tokens = np.unique(raw, return_inverse=True)
    n_blocks = raw.size // PYCHARS_BLOCK
    n_test_blocks = int(round(test_fraction * n_blocks))
    n_test = int(round(test_fraction * num_samples))
    if n_test_blocks < 1 or n_test_blocks >= n_blocks or n_test < 1 or n_test >= num_samples:
        raise ValueError(f"pychars: test_fraction={test_fraction} leaves an empty split "
                         f"({n_blocks} blocks, {num_samples} samples)")
    rng = np.random.default_rng([_TAG_PYCHARS, seed])
    is_test = np.zeros(n_blocks, dtype=bool)
    is_test[rng.permutation(n_blocks)[:n_test_blocks]] = True
    per_block = PYCHARS_BLOCK - context          # window starts whose target stays inside the block
    offsets = np.arange(per_block)

    def windows(blocks, m, part):
        starts = (blocks[:, None] * PYCHARS_BLOCK + offsets).reshape(-1)
        if m > starts.size:
            raise ValueError(f"pychars: {m} {part} windows asked, the corpus holds {starts.size} "
                             f"(lower num_samples or context)")
        starts = starts[rng.choice(starts.size, m, replace=False)]
        x = tokens[starts[:, None] + np.arange(context)].astype(np.float32)
        return x, tokens[starts + context].astype(np.int64), starts.astype(np.int64)

    x_tr, y_tr, s_tr = windows(np.flatnonzero(~is_test), num_samples - n_test, "training")
    x_te, y_te, s_te = windows(np.flatnonzero(is_test), n_test, "test")
    p = np.bincount(y_tr, minlength=vocab.size) / y_tr.size
    unigram = float(-np.sum(p[p > 0] * np.log(p[p > 0])))
    meta = dict(python_version=platform.python_version(), stdlib=stdlib, modules=list(PYCHARS_MODULES),
                sha256=hashlib.sha256(corpus).hexdigest(), corpus_bytes=int(raw.size),
                vocab=[int(v) for v in vocab], unigram_loss=unigram, context=context,
                train_starts=s_tr, test_starts=s_te)
    return Dataset("pychars", "classification", x_tr, y_tr, x_te, y_te, int(vocab.size), (context,), meta)


# ---------------------------------------------------------------------------------------------

def _torch(seed: int, *, factory: str = "", kwargs: dict | None = None, task: str = "classification",
           classes: int = 0, max_train: int = 0, max_test: int = 0) -> Dataset:
    """A user's torch data set (tgsim.torch.data; needs the `torch` extra). `seed` does not affect it."""
    if not factory:
        raise ValueError("data 'torch': give options.factory = 'package.module:function' returning "
                         "(train, test) torch Datasets or a dict of x_train, y_train, x_test, y_test")
    import importlib

    try:
        torch_data = importlib.import_module("tgsim.torch.data")
        fields = torch_data.load_torch(factory, kwargs, task, classes, max_train, max_test)
    except ImportError as e:
        raise ValueError(f"data 'torch' needs PyTorch: pip install 'tgsim[torch]' ({e})") from None
    return Dataset("torch", **fields)


_LOADERS: dict[str, Callable[..., Dataset]] = {
    "least_squares": _least_squares,
    "classification": _classification,
    "digits": functools.partial(_sklearn, "digits"),
    "breast_cancer": functools.partial(_sklearn, "breast_cancer"),
    "wine": functools.partial(_sklearn, "wine"),
    "mnist1d": _mnist1d,
    "torch": _torch,
    "pychars": _pychars,
}

DATASETS: tuple[str, ...] = tuple(_LOADERS)


def dataset_kwargs(name: str) -> dict[str, Any]:
    """The keyword arguments `load(name, ...)` accepts, with their defaults."""
    if name not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    sig = inspect.signature(_LOADERS[name])
    return {p.name: p.default for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY}


def load(name: str, seed: int = 0, *, validation: float = 0.0, validation_stratify: bool = True,
         **kwargs) -> Dataset:
    """Load dataset `name`; see the module docstring for the names and their keyword arguments.

    Unknown names or keyword arguments raise ValueError listing the valid ones. `validation` > 0
    holds that fraction of the training split out as the evaluation set (see the module docstring);
    validation_stratify False draws those rows without stratifying by label (for labels seen once).
    """
    valid = dataset_kwargs(name)
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(f"unknown keyword argument(s) {', '.join(map(repr, unknown))} for dataset "
                         f"{name!r}; valid: validation=0.0, validation_stratify=True, "
                         f"{', '.join(f'{k}={v!r}' for k, v in valid.items())}")
    validation = _check_float("validation", validation, 0.0)
    if validation >= 1.0:
        raise ValueError(f"validation must be in [0, 1), got {validation}")
    ds = _LOADERS[name](_check_seed(seed), **kwargs)
    if not isinstance(validation_stratify, bool):
        raise ValueError(f"validation_stratify must be true or false, got {validation_stratify!r}")
    return _hold_out(ds, validation, seed, validation_stratify) if validation > 0 else ds


def _hold_out(ds: Dataset, fraction: float, seed: int, stratify: bool = True) -> Dataset:
    """`ds` with `fraction` of its training rows moved into the evaluation set (the test set dropped),
    stratified by label for classification unless `stratify` is False."""
    from sklearn.model_selection import train_test_split

    classification = ds.task == "classification" and stratify
    try:
        idx_fit, idx_val = train_test_split(
            np.arange(ds.n_train), test_size=fraction, stratify=ds.y_train if classification else None,
            random_state=int(np.random.SeedSequence([_TAG_VALIDATION, seed]).generate_state(1)[0]))
    except ValueError as e:   # e.g. fewer held-out rows than classes
        raise ValueError(f"{ds.name}: cannot hold out validation={fraction} of {ds.n_train} training rows: "
                         f"{e}") from None
    idx_fit, idx_val = np.sort(idx_fit), np.sort(idx_val)
    meta = {**ds.meta, "eval_split": "validation", "validation": fraction, "n_test_not_used": ds.n_test}
    return Dataset(ds.name, ds.task, ds.x_train[idx_fit], ds.y_train[idx_fit], ds.x_train[idx_val],
                   ds.y_train[idx_val], ds.n_classes, ds.feature_shape, meta)
