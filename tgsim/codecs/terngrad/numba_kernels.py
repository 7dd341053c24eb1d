"""The Numba CPU kernel set of TernGrad (what `kernels.get_kernels("numba")` returns), bit-identical
to the array reference (`tgsim.codecs.terngrad.reference`).

Same entry points as `tgsim.codecs.terngrad.reference` (moments, encode, their batched-over-workers forms
moments_many and encode_many, weighted_sum, sum_codes), for NumPy arrays. Every kernel computes
exactly the reference's operations in the reference's order
(`tgsim.rng.philox`, `terngrad.moments`, `terngrad.quantizer`, `tgsim.codecs.packing`); only the
loop structure differs:

* moments: one parallel pass. absmax and finiteness come from the largest |g| bit pattern (an
  integer max: the ordering of non-negative IEEE floats is the ordering of their bits, inf is
  0x7f800000 and every NaN is above it). The σ sums follow the documented lane order: LANES lanes,
  lane j sums d_i = f64(g_i) - K over i ≡ j (mod LANES) in ascending i; each thread owns fixed
  ranges of lanes and walks the rows, so the bits do not depend on the thread count; then the
  fixed pairwise tree and the float64 operations of `stats.moments_from_sums` (elementwise over
  workers in NumPy: the same IEEE operations). No fastmath anywhere (no FMA contraction, no
  reassociation). Layers of _FOLD_MIN..LANES elements hold one element per lane (0.0 + d_i), so
  the top three non-empty tree levels are computed straight from g, eight elements at a time, in
  the tree's order (_sigma_small), and only the remaining levels run on an array of partials: no
  n-sized float64 scratch, about half the time of the unfolded pass.
* batched over workers: moments_many / encode_many take the W workers' copies of one layer, G (W, n),
  and run one pass over all of them: serially on the calling thread when W * n is small (a parallel
  region costs more to start than such a pass), else one parallel region over (worker, chunk)
  pairs (or over workers, when there are many). The single-worker functions are the W = 1 case.
* encode: Philox4x32-10 block -> four words -> the exact ternary rule -> code -> packed byte, in one
  parallel pass. The rule f64(t)*f64(s) < f64(x)*2^24 is evaluated as f64(t)*(f64(s)*2^-24) <
  f64(x): both sides are the reference's exact products scaled by the same power of two (t*s has
  at most 48 significant bits, and |t*s*2^-24| >= 2^-173 is far from the float64 subnormal
  range), so every comparison - including inf/NaN/zero cases - has the same outcome.
* weighted_sum / sum_codes: one parallel pass over the payloads in chunks of bytes; per chunk the
  bytes of every worker are decoded into SoA scratch (contiguous, byte/word-wide SIMD), validated
  on the way (2-bit: a 0b11 pair; base-3: > 242), and the chunk's float32/int results written.
  Three exact routes to the reference's float64 sum acc = (((0 + c_0 s_0) + c_1 s_1) + ...):
    - one shared scaler s (TernGrad's MAX-shared scaler: finite, > 0, a float32 value): every
      partial sum is j*s for a small integer j, exactly representable, so acc = f64(Σ codes) * s;
      only the integer code counts are accumulated (uint8 lanes for <= 127 workers);
    - per-worker scalers: the first (up to) 8 workers' codes form a base-3 index into a table of
      the reference's partial sums for all 3^8 code tuples (computed with the reference's own
      float64 operations), and any further workers are added in float64 in ascending order.
  out = f32(acc * (1/divide_by)) as in the reference. (NaN results are NaN, but the sign/payload
  of a NaN made from NaN operands is not specified by IEEE 754 nor reproducible across builds.)

Everything compiles lazily on the first call (`cache=True` keeps the machine code on disk).

The kernels live by job: numba_moments (absmax, σ), numba_encode (Philox -> rule -> bytes),
numba_decode (decode-and-sum of payloads), tgsim.rng.numba_philox (the words); numba_layers runs
them over every layer of a step in one call (moments_layers, encode_layers, weighted_sum_layers,
scaled_code_sum_layers, and for the integer all-reduce sum_codes_layers, decode_code_sums_layers);
numba_common holds their input checks and serial/parallel thresholds.
"""

from tgsim.codecs.terngrad.numba_decode import WEIGHTED_SUM_INTO_OUT, scaled_code_sum, sum_codes, weighted_sum
from tgsim.codecs.terngrad.numba_encode import encode, encode_many, encode_range
from tgsim.codecs.terngrad.numba_layers import (decode_code_sums_layers, encode_layers, moments_layers,
                                                scaled_code_sum_layers, sum_codes_layers, weighted_sum_layers)
from tgsim.codecs.terngrad.numba_moments import moments, moments_many
from tgsim.rng.numba_philox import philox4x32_10, philox_block, random_words

__all__ = ["moments", "encode", "encode_range", "moments_many", "encode_many", "weighted_sum", "sum_codes",
           "scaled_code_sum", "moments_layers", "encode_layers", "weighted_sum_layers", "scaled_code_sum_layers",
           "sum_codes_layers", "decode_code_sums_layers", "WEIGHTED_SUM_INTO_OUT", "philox_block", "philox4x32_10",
           "random_words"]
