"""Gradient codecs: TernGrad and (later) its peers behind one protocol (`tgsim.codecs.base`)."""

from tgsim.codecs.base import Codec, NonFiniteGradientError
from tgsim.codecs.message import Layout, LayerSpec, Message, from_bytes
from tgsim.codecs.terngrad import DeferredMessage, TernGrad

__all__ = ["Codec", "DeferredMessage", "NonFiniteGradientError", "Layout", "LayerSpec", "Message", "TernGrad", "from_bytes"]
