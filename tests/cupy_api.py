"""The CuPy calls tgsim makes on paths that can run with CuPy, and the keywords CuPy accepts for them.

Data for tests/test_cupy_api.py (a static scan of tgsim/ for `xp.<name>(...)` calls) and for the
stand-in `cupy` of tests/test_cuda_kernels.py (`strict` below: a NumPy function that refuses, with
TypeError, a keyword CuPy does not accept). Why: issue 23. On an H100, `xp.unpackbits(payload,
count=...)` raised `TypeError: unpackbits() got an unexpected keyword argument 'count'`: NumPy has
`count`, CuPy does not, and nothing on the CPU could see it.

API maps a name as written after `xp.` (or `cp.`, `cupy.`) to the keyword arguments CuPy accepts
for it (positional-only use is not checked). The comment names the page under DOCS; DOC_PAGES lists
the pages that were read (docs search), and every signature was also read in the CuPy source
(cupy/cupy at 6b6d9563, Aug 2026; "source:" where the docs have no page of its own). A call in
tgsim that uses a name or keyword missing here fails the scan: check the new call against CuPy's
docs, then add it.

NOT_IMPLEMENTED: keywords CuPy accepts in the signature but refuses at run time for any value but
the default (NotImplementedError), e.g. `axis` of packbits/unpackbits.
"""

from __future__ import annotations

import functools

DOCS = "https://docs.cupy.dev/en/latest/reference/generated/"

# ufunc __call__: out, dtype, casting (NumPy's where=, order=, subok=, signature= are TypeErrors)
# https://docs.cupy.dev/en/v11.6.0/reference/generated/cupy.ufunc.html ;
# source: cupy/_core/_kernel.pyx ufunc.__call__ ("Wrong arguments" TypeError for anything else)
UFUNC = ("out", "dtype", "casting")

API: dict[str, tuple[str, ...]] = {
    # ---- creation ----------------------------------------------------------------------------
    "arange": ("start", "stop", "step", "dtype"),                    # DOCS cupy.arange.html
    "array": ("obj", "dtype", "copy", "order", "subok", "ndmin", "blocking"),   # cupy.array.html
    "asarray": ("a", "dtype", "order", "copy", "blocking"),          # cupy.asarray.html
    "ascontiguousarray": ("a", "dtype"),                             # cupy.ascontiguousarray.html
    "empty": ("shape", "dtype", "order"),                            # cupy.empty.html
    "zeros": ("shape", "dtype", "order"),                            # cupy.zeros.html
    "ones": ("shape", "dtype", "order"),                             # cupy.ones.html
    "full": ("shape", "fill_value", "dtype", "order"),               # cupy.full.html
    "zeros_like": ("a", "dtype", "order", "subok", "shape"),         # cupy.zeros_like.html (v7.8.0+)
    "empty_like": ("prototype", "dtype", "order", "subok", "shape"), # cupy.empty_like.html
    "from_dlpack": ("array",),                                       # cupy.from_dlpack.html (v12: array only)
    "copyto": ("dst", "src", "casting", "where"),                    # cupy.copyto.html
    # ---- user kernels (tgsim/bench/codec_gpu.py) ---------------------------------------------------
    "ElementwiseKernel": ("in_params", "out_params", "operation", "name", "reduce_dims", "options",
                          "preamble", "no_return", "return_tuple", "loop_prep", "after_loop"),
                                                                     # cupy.ElementwiseKernel.html
    "diag": ("v", "k"),                                              # cupy.diag.html
    # ---- manipulation --------------------------------------------------------------------------
    "concatenate": ("tup", "axis", "out", "dtype", "casting"),       # cupy.concatenate.html
    "stack": ("tup", "axis", "out", "dtype", "casting"),             # cupy.stack.html
    "broadcast_to": ("array", "shape"),                              # cupy.broadcast_to.html
    # broadcast_shapes: numpy.broadcast_shapes re-exported (source: cupy/__init__.py), *args only
    "broadcast_shapes": (),
    "swapaxes": ("a", "axis1", "axis2"),                             # cupy.swapaxes.html
    "repeat": ("a", "repeats", "axis"),                              # cupy.repeat.html
    "shape": ("a",),                                                 # cupy.shape.html
    "pad": ("array", "pad_width", "mode", "constant_values", "end_values", "reflect_type",
            "stat_length"),                                          # cupy.pad.html (**kwargs by mode)
    # ---- indexing / searching ------------------------------------------------------------------
    "take": ("a", "indices", "axis", "out"),                         # cupy.take.html (no mode=)
    "take_along_axis": ("a", "indices", "axis"),                     # cupy.take_along_axis.html
    "where": ("condition", "x", "y"),                                # cupy.where.html
    "nonzero": ("a",),                                               # cupy.nonzero.html
    "argmax": ("a", "axis", "dtype", "out", "keepdims"),             # cupy.argmax.html
    "argmin": ("a", "axis", "dtype", "out", "keepdims"),             # cupy.argmin.html
    "cumsum": ("a", "axis", "dtype", "out"),                         # cupy.cumsum.html
    "count_nonzero": ("a", "axis"),                                  # cupy.count_nonzero.html
    # ---- reductions ------------------------------------------------------------------------------
    "sum": ("a", "axis", "dtype", "out", "keepdims"),                # cupy.sum.html
    "any": ("a", "axis", "out", "keepdims"),                         # cupy.any.html
    # ---- binary packing: no `count` (NumPy has it, CuPy does not) --------------------------------
    "packbits": ("a", "axis", "bitorder"),                           # cupy.packbits.html
    "unpackbits": ("a", "axis", "bitorder"),                         # cupy.unpackbits.html
    # ---- ufuncs (UFUNC keywords) ---------------------------------------------------------------
    "abs": UFUNC, "copysign": UFUNC, "cos": UFUNC, "exp": UFUNC, "floor": UFUNC, "isfinite": UFUNC,
    "isnan": UFUNC, "log": UFUNC, "log1p": UFUNC, "maximum": UFUNC, "minimum": UFUNC,
    "negative": UFUNC, "nextafter": UFUNC, "sqrt": UFUNC, "subtract": UFUNC,
    # matmul: a _GUFunc (source: cupy/linalg/_product.py); tgsim passes no keyword
    "matmul": ("out", "dtype", "casting", "axes", "axis"),           # cupy.matmul.html
    "linalg.solve": ("a", "b"),                                      # cupy.linalg.solve.html
    # ---- scalar types used as constructors (numpy's, re-exported) ------------------------------
    "float32": (), "float64": (), "int8": (), "int16": (), "int32": (), "int64": (),
    "uint8": (), "uint16": (), "uint32": (), "uint64": (),
    # ---- host transfer, kernels, devices ---------------------------------------------------------
    "asnumpy": ("a", "stream", "order", "out", "blocking"),          # cupy.asnumpy.html
    "RawModule": ("code", "path", "options", "backend", "translate_cucomplex",
                  "enable_cooperative_groups", "name_expressions", "jitify"),   # cupy.RawModule.html
    "cuda.Device": ("device",),                                      # cupy.cuda.Device.html
    "cuda.runtime.getDeviceCount": (),                               # source: cupy_backends runtime
    # getDeviceProperties(int device) -> dict of cudaDeviceProp fields, "name" as bytes; positional
    "cuda.runtime.getDeviceProperties": (),                          # source: cupy_backends runtime.pyx
    "cuda.get_current_stream": ("device",),                          # cupy.cuda.get_current_stream.html
    "cuda.alloc_pinned_memory": ("size",),                           # cupy.cuda.alloc_pinned_memory.html
}

# keyword -> the only value CuPy takes (anything else: NotImplementedError at run time)
NOT_IMPLEMENTED: dict[tuple[str, str], object] = {
    ("packbits", "axis"): None,      # cupy.packbits.html: "axis (int, optional) - Not supported yet."
    ("unpackbits", "axis"): None,    # cupy.unpackbits.html: "does not support axis option"
}

# The doc pages the entries above were checked against (search tool, corpus "docs").
DOC_PAGES = {
    "unpackbits": DOCS + "cupy.unpackbits.html",
    "packbits": DOCS + "cupy.packbits.html",
    "RawModule": "https://docs.cupy.dev/en/v13.0.0/reference/generated/cupy.RawModule.html",
    "take_along_axis": "https://docs.cupy.dev/en/stable/reference/generated/cupy.take_along_axis.html",
    "take": DOCS + "cupy.take.html",
    "sum": DOCS + "cupy.sum.html",
    "array": DOCS + "cupy.array.html",
    "asarray": DOCS + "cupy.asarray.html",
    "asnumpy": DOCS + "cupy.asnumpy.html",
    "ascontiguousarray": DOCS + "cupy.ascontiguousarray.html",
    "stack": DOCS + "cupy.stack.html",
    "concatenate": DOCS + "cupy.concatenate.html",
    "arange": "https://docs.cupy.dev/en/stable/reference/generated/cupy.arange.html",
    "full": DOCS + "cupy.full.html",
    "zeros": DOCS + "cupy.zeros.html",
    "zeros_like": "https://docs.cupy.dev/en/v7.8.0/reference/generated/cupy.zeros_like.html",
    "empty_like": DOCS + "cupy.empty_like.html",
    "from_dlpack": "https://docs.cupy.dev/en/v12.2.0/reference/generated/cupy.from_dlpack.html",
    "copyto": "https://docs.cupy.dev/en/stable/reference/generated/cupy.copyto.html",
    "ElementwiseKernel": "https://docs.cupy.dev/en/stable/reference/generated/cupy.ElementwiseKernel.html",
    "pad": DOCS + "cupy.pad.html",
    "ufunc": "https://docs.cupy.dev/en/v11.6.0/reference/generated/cupy.ufunc.html",
    "cuda.alloc_pinned_memory":
        "https://docs.cupy.dev/en/v8.6.0/reference/generated/cupy.cuda.alloc_pinned_memory.html",
    "cuda.get_current_stream":
        "https://docs.cupy.dev/en/v7.8.0/reference/generated/cupy.cuda.get_current_stream.html",
}


# What CuPy appends to every RawModule's options: cupy/cuda/compiler.py, _compile_with_cache_cuda,
# `options += ('-ftz=true',)` after the caller's options, so it wins over a -ftz=false there (nvcc:
# "incompatible redefinition for option 'ftz', the last value of this option was used"). Issue 23's
# H100 run showed it: denormal float32 inputs were read as zeros although tgsim passed -ftz=false.
# RawModule docs (options are handed to NVRTC): cupy.RawModule.html above.
APPENDED_OPTIONS = ("-ftz=true",)


def effective_options(options) -> list[str]:
    """The options a RawModule(options=...) is compiled with: CuPy's appended ones replace ours."""
    appended = {o.split("=")[0] for o in APPENDED_OPTIONS}
    return [o for o in options if o.split("=")[0] not in appended] + list(APPENDED_OPTIONS)


def effective_ftz(options) -> bool:
    """Whether CuPy compiles a RawModule with `options` to flush float32 denormals (last -ftz wins)."""
    value = False
    for o in tuple(options) + APPENDED_OPTIONS:
        if o.split("=")[0] in ("-ftz", "--ftz"):
            value = not o.endswith("=false")
    return value


def accepts(name: str, keyword: str) -> bool:
    return name in API and keyword in API[name]


def strict(fn, name: str):
    """`fn` (a NumPy function standing in for cupy.<name>) that raises TypeError, as CuPy does, for a
    keyword CuPy does not accept, and NotImplementedError for an unsupported keyword value."""
    if name not in API:
        raise KeyError(f"cupy.{name} is not in tests/cupy_api.API: check it against CuPy's docs first")

    @functools.wraps(fn)
    def call(*args, **kwargs):
        for k, v in kwargs.items():
            if k not in API[name]:
                raise TypeError(f"{name}() got an unexpected keyword argument {k!r} (CuPy)")
            if (name, k) in NOT_IMPLEMENTED and v is not NOT_IMPLEMENTED[(name, k)]:
                raise NotImplementedError(f"cupy.{name}: {k}={v!r} is not supported")
        return fn(*args, **kwargs)

    return call
