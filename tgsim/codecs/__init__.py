"""Gradient codecs: TernGrad and (later) its peers behind one protocol (`tgsim.codecs.base`)."""

from tgsim.codecs.base import Codec
from tgsim.codecs.message import Layout, LayerSpec, Message, from_bytes
from tgsim.codecs.terngrad import DeferredMessage, TernGrad
from tgsim.errors import NonFiniteGradientError, PayloadError

__all__ = ["Codec", "DeferredMessage", "NonFiniteGradientError", "Layout", "LayerSpec", "Message", "PayloadError", "TernGrad",
           "from_bytes"]
