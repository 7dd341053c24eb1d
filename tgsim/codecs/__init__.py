"""Gradient codecs: TernGrad and its peers behind one protocol (`tgsim.codecs.base`).

Every registered codec class is importable from here (`from tgsim.codecs import QSGD`), as is
`ErrorFeedback`; each loads its module on first use (the classes of tgsim.codecs.registry.CODECS),
so importing tgsim.codecs costs no codec module besides TernGrad's.
"""

from __future__ import annotations

import importlib

from tgsim.codecs.base import Codec, CodecProperties
from tgsim.codecs.message import Layout, LayerSpec, Message, from_bytes
from tgsim.codecs.registry import CODECS
from tgsim.codecs.terngrad import DeferredMessage, TernGrad
from tgsim.errors import NonFiniteGradientError, PayloadError

# class name -> module, of every registered codec and the error-feedback wrapper
_LAZY = {**{target.partition(":")[2]: target.partition(":")[0] for target in CODECS.values()},
         "ErrorFeedback": "tgsim.codecs.error_feedback"}


def __getattr__(name: str):
    """A codec class of `_LAZY`, its module imported on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tgsim.codecs' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted({"Codec", "CodecProperties", "DeferredMessage", "NonFiniteGradientError", "Layout", "LayerSpec",
                  "Message", "PayloadError", "TernGrad", "from_bytes", *_LAZY})
