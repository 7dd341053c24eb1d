"""TernGrad (Wen et al. 2017): stochastic ternary codes with a per-layer scaler, one package.

    codec          TernGrad: the codec protocol (prepare / encode / decode, bits, properties)
    quantizer      the ternary rule, the per-layer scaler and c·σ clipping (docs/THEORY.md §1)
    moments        absmax and σ of a layer in the documented lane order
    kernels        which kernel set runs: reference (xp), numba_kernels (CPU), cuda (CuPy)
    reference      the array reference of every kernel (NumPy and CuPy)
    numba_*        the Numba kernels by job: moments, encode, decode-and-sum (numba_kernels: the set)
    cuda           the CUDA kernels (tgsim/cuda/terngrad.cu) through CuPy

Its messages use the packed-code wire ("tgm1": tgsim.codecs.message, tgsim.codecs.packing), which
the exchange sums as integers.
"""

from tgsim.codecs.terngrad.codec import DeferredMessage, TernGrad

__all__ = ["DeferredMessage", "TernGrad"]
