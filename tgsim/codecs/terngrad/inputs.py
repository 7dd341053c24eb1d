"""A TernGrad layer's gradient as flat float32: the dtype rules of tgsim.codecs.terngrad.codec.

float32 as is; float16 widened exactly; float64 rounded to float32 (values beyond float32's range
are an error naming the layer and, for rows, the lowest worker); integer, boolean and complex
gradients raise TypeError.
"""

from __future__ import annotations

import math

import numpy as np

from tgsim.backend import array_module, to_numpy

_F32_MAX = float(np.finfo(np.float32).max)


def as_float32_layer(name: str, g):
    """Flat, contiguous float32 view/copy of the gradient `g` of layer `name`; TypeError for a non-float
    dtype, ValueError (naming the layer) for float64 values beyond float32's range."""
    xp = array_module(g)
    g = xp.asarray(g)
    if g.dtype.kind != "f":
        raise TypeError(f"layer {name!r}: gradient dtype {g.dtype} is not floating point "
                        "(expected float16, float32 or float64)")
    if g.dtype.itemsize > 4 and g.size:  # float64, longdouble: rounding to float32 may overflow
        big = xp.abs(g[xp.isfinite(g)]).max() if bool(xp.isfinite(g).any()) else 0.0
        if float(big) > _F32_MAX:
            raise ValueError(f"layer {name!r}: {g.dtype} gradient value {float(big):.3g} overflows float32")
    return xp.ascontiguousarray(g, dtype=xp.float32).reshape(-1)


def as_float32_rows(name: str, g, workers: int | None = None):
    """(W, n) float32 view/copy of the gradients `g` (W, *shape) of layer `name` with a leading worker
    axis, each row contiguous (a host array's rows in a larger buffer are kept in place, with its
    row stride; else a C-contiguous array): the checks and conversion of `as_float32_layer`, once for
    all W workers.

    TypeError for a non-float dtype; ValueError (naming the first worker) for float64 values beyond
    float32's range; ValueError when the leading axis is missing or is not `workers` long.
    """
    if (type(g) is np.ndarray and g.dtype == np.float32 and g.ndim
            and (workers is None or g.shape[0] == workers)):
        rows = g.reshape(g.shape[0], math.prod(g.shape[1:]))
        if g.flags.c_contiguous or rows.strides[1] == 4:    # rows of one buffer (FlatLayers): kept in place
            return rows
    xp = array_module(g)
    g = xp.asarray(g)
    if g.ndim == 0:
        raise ValueError(f"layer {name!r}: expected a leading worker axis, got a scalar")
    if workers is not None and g.shape[0] != workers:
        raise ValueError(f"layer {name!r}: leading (worker) axis has {g.shape[0]} entries, expected {workers}")
    if g.dtype.kind != "f":
        raise TypeError(f"layer {name!r}: gradient dtype {g.dtype} is not floating point "
                        "(expected float16, float32 or float64)")
    nw = g.shape[0]
    if g.dtype.itemsize > 4 and g.size:  # float64, longdouble: rounding to float32 may overflow
        rows = g.reshape(nw, -1)
        big = xp.abs(xp.where(xp.isfinite(rows), rows, 0)).max(axis=1)
        over = to_numpy(big > _F32_MAX)
        if over.any():
            w = int(np.argmax(over))
            err = ValueError(f"layer {name!r}: {g.dtype} gradient value {float(big[w]):.3g} of worker {w} "
                             "overflows float32")
            err.worker = w
            raise err
    return xp.ascontiguousarray(g, dtype=xp.float32).reshape(nw, math.prod(g.shape[1:]))
