// Philox4x32-10 and the TernGrad element rules, as __host__ __device__ functions.
//
// The same functions compile for the GPU (NVRTC through CuPy, or nvcc) and for the CPU (nvcc's
// host pass, used by tgsim/cuda/host_harness.cu to test the kernel logic without a GPU). They
// must equal the array reference bit for bit:
//   tgsim/rng/philox.py       Philox4x32-10, stream layout
//   tgsim/codecs/terngrad/quantizer.py   the element decision
//   tgsim/codecs/packing.py   2-bit / base-3 wire formats
//   tgsim/codecs/terngrad/moments.py     lane-ordered sums
//
// No system header is included: NVRTC has none. Floating-point arithmetic that must not be
// contracted into FMA goes through tg_dadd / tg_dsub / tg_dmul (the __d*_rn intrinsics on the
// device, which are never contracted; plain operators on the host, where the build passes
// -ffp-contract=off). The module is also compiled with -fmad=false as a second guard.
#ifndef TGSIM_PHILOX_CUH
#define TGSIM_PHILOX_CUH

#define TG_HD __host__ __device__ inline

#define TG_PHILOX_M0 0xD2511F53u
#define TG_PHILOX_M1 0xCD9E8D57u
#define TG_PHILOX_W0 0x9E3779B9u
#define TG_PHILOX_W1 0xBB67AE85u
#define TG_PHILOX_ROUNDS 10

#define TG_LANES 65536           // terngrad/moments.py LANES
#define TG_FMT_2BIT 0
#define TG_FMT_BASE3 1
#define TG_NO_BAD 0xFFFFFFFFFFFFFFFFull   // "no invalid byte" value of first_bad

// ---------------------------------------------------------------------------------------------
// exact arithmetic helpers (no FMA contraction, round-to-nearest-even)
// ---------------------------------------------------------------------------------------------
TG_HD double tg_dadd(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

TG_HD double tg_dsub(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}

TG_HD double tg_dmul(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

TG_HD float tg_d2f(double a) {
#ifdef __CUDA_ARCH__
    return __double2float_rn(a);
#else
    return (float)a;   // x86-64 SSE2 cvtsd2ss: round to nearest even, denormals kept
#endif
}

TG_HD unsigned int tg_float_bits(float v) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(v);
#else
    union { float f; unsigned int u; } c;
    c.f = v;
    return c.u;
#endif
}

TG_HD bool tg_isfinite(float v) { return (tg_float_bits(v) & 0x7F800000u) != 0x7F800000u; }

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 (Salmon et al. 2011)
// ---------------------------------------------------------------------------------------------
TG_HD unsigned int tg_mulhi(unsigned int a, unsigned int b) {
#ifdef __CUDA_ARCH__
    return __umulhi(a, b);
#else
    return (unsigned int)(((unsigned long long)a * (unsigned long long)b) >> 32);
#endif
}

// out[0..3] = Philox4x32-10(counter c0..c3, key k0, k1)
TG_HD void tg_philox4x32_10(unsigned int c0, unsigned int c1, unsigned int c2, unsigned int c3,
                            unsigned int k0, unsigned int k1, unsigned int out[4]) {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int r = 0; r < TG_PHILOX_ROUNDS; ++r) {
        unsigned int hi0 = tg_mulhi(TG_PHILOX_M0, c0), lo0 = TG_PHILOX_M0 * c0;
        unsigned int hi1 = tg_mulhi(TG_PHILOX_M1, c2), lo1 = TG_PHILOX_M1 * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += TG_PHILOX_W0;   // the bump after the last round is never used
        k1 += TG_PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

// The 4 words of Philox block `block` of stream (k0, k1; layer, worker, step): counter
// (block, layer, worker, step). Element i of a layer takes word i % 4 of block i / 4.
TG_HD void tg_stream_block(unsigned int block, unsigned int k0, unsigned int k1, unsigned int layer,
                           unsigned int worker, unsigned int step, unsigned int out[4]) {
    tg_philox4x32_10(block, layer, worker, step, k0, k1, out);
}

// ---------------------------------------------------------------------------------------------
// the ternary element rule (ternary.ternarize / ternary_rule)
// ---------------------------------------------------------------------------------------------
// x = min(|g|, clip_bound) with NumPy's np.minimum semantics (a NaN operand gives NaN); for
// finite values it is fminf. clip_bound = +inf means "no clipping".
TG_HD float tg_clip_abs(float g, float clip_bound) {
    float x = fabsf(g);
    if (x != x) return x;
    return x < clip_bound ? x : clip_bound;   // a NaN bound fails the test and is returned
}

// code in {-1, 0, +1} of one element from its Philox word:
//   t = word >> 8 (top 24 bits); nonzero iff f64(t) * f64(s) < f64(x) * 2^24 (both products exact);
//   sign +1 iff g > 0.
TG_HD int tg_ternary_code(float g, unsigned int word, float s, float clip_bound) {
    unsigned int t = word >> 8;
    float x = tg_clip_abs(g, clip_bound);
    bool keep = tg_dmul((double)t, (double)s) < tg_dmul((double)x, 16777216.0);
    return keep ? (g > 0.0f ? 1 : -1) : 0;
}

// ---------------------------------------------------------------------------------------------
// wire formats (packing.py): decode one byte into codes; invalid bytes decode to all zeros
// (like packing.LUT) and return false.
// ---------------------------------------------------------------------------------------------
TG_HD int tg_codes_per_byte(int fmt) { return fmt == TG_FMT_2BIT ? 4 : 5; }

TG_HD bool tg_decode_byte(unsigned int byte, int fmt, int codes[5]) {
    bool valid;
    if (fmt == TG_FMT_2BIT) {
        valid = true;
        for (int m = 0; m < 4; ++m) {
            unsigned int d = (byte >> (2 * m)) & 3u;
            valid = valid && d != 3u;
            codes[m] = (int)d - 1;
        }
        codes[4] = 0;
    } else {
        valid = byte <= 242u;
        unsigned int b = byte;
        for (int m = 0; m < 5; ++m) {
            codes[m] = (int)(b % 3u) - 1;
            b /= 3u;
        }
    }
    if (!valid)
        for (int m = 0; m < 5; ++m) codes[m] = 0;
    return valid;
}

#endif  // TGSIM_PHILOX_CUH
