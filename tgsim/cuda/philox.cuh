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
//
// No float32 arithmetic, comparison or conversion instruction: CuPy compiles every RawModule with
// -ftz=true appended after the caller's options (cupy/cuda/compiler.py), so any .f32 instruction
// would read denormal float32 values as zeros (sigma, packed bytes and signed zeros would then
// differ from the NumPy reference). float32 values are widened exactly with tg_f2d (integer bit
// operations and exact double arithmetic: FTZ only ever applies to .f32 instructions), compared as
// doubles, and narrowed with tg_d2f (integer round-to-nearest-even). tests/test_cuda_kernels.py checks that
// the PTX compiled with -ftz=true has no .ftz instruction at all, and runs the host bodies with
// x86 FTZ/DAZ set.
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

TG_HD unsigned int tg_float_bits(float v) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(v);
#else
    union { float f; unsigned int u; } c;
    c.f = v;
    return c.u;
#endif
}

TG_HD float tg_float_from_bits(unsigned int u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    union { unsigned int u; float f; } c;
    c.u = u;
    return c.f;
#endif
}

TG_HD unsigned long long tg_double_bits(double v) {
#ifdef __CUDA_ARCH__
    return (unsigned long long)__double_as_longlong(v);
#else
    union { double d; unsigned long long u; } c;
    c.d = v;
    return c.u;
#endif
}

TG_HD double tg_double_from_bits(unsigned long long u) {
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    union { unsigned long long u; double d; } c;
    c.u = u;
    return c.d;
#endif
}

// |v| (clears the sign bit: no float instruction)
TG_HD float tg_fabs(float v) { return tg_float_from_bits(tg_float_bits(v) & 0x7FFFFFFFu); }

// f64(v), exact, for every float32 including denormals and signed zeros, under any FTZ mode:
// normal/inf/NaN by re-biasing the exponent; zero and denormals as m * 2^-149 (an exact int ->
// double conversion and an exact double product; FTZ never applies to doubles).
TG_HD double tg_f2d(float v) {
    unsigned int b = tg_float_bits(v);
    unsigned long long sign = (unsigned long long)(b >> 31) << 63;
    unsigned int e = (b >> 23) & 0xFFu, m = b & 0x007FFFFFu;
    if (e == 0u) {
        double d = tg_dmul((double)(int)m, tg_double_from_bits(0x36A0000000000000ull));   // 2^-149
        return sign ? -d : d;
    }
    unsigned long long de = e == 0xFFu ? 0x7FFull : (unsigned long long)(e + 896u);   // 1023 - 127
    return tg_double_from_bits(sign | (de << 52) | ((unsigned long long)m << 29));
}

// f32(a), round to nearest even, denormal results kept (as x86-64 cvtsd2ss without FTZ, which is
// what NumPy's astype(float32) does), in integer arithmetic. NaN: quiet, top payload bits kept.
TG_HD float tg_d2f(double a) {
    unsigned long long u = tg_double_bits(a);
    unsigned int sign = (unsigned int)(u >> 32) & 0x80000000u;
    unsigned int e = (unsigned int)(u >> 52) & 0x7FFu;
    unsigned long long frac = u & 0x000FFFFFFFFFFFFFull;
    if (e == 0x7FFu)
        return tg_float_from_bits(sign | 0x7F800000u | (frac ? 0x00400000u | (unsigned int)(frac >> 29) : 0u));
    unsigned long long m = e ? (frac | (1ull << 52)) : frac;   // |a| = m * 2^(eff - 1075)
    int eff = e ? (int)e : 1;
    unsigned long long q, rem, half;
    if (eff >= 897) {                       // |a| >= 2^-126: a normal result (or overflow)
        q = m >> 29;
        rem = m & 0x1FFFFFFFull;
        half = 1ull << 28;
        if (rem > half || (rem == half && (q & 1ull))) ++q;
        unsigned int E = (unsigned int)(eff - 896);
        if (q == (1ull << 24)) { q >>= 1; ++E; }
        if (E >= 255u) return tg_float_from_bits(sign | 0x7F800000u);
        return tg_float_from_bits(sign | (E << 23) | ((unsigned int)q & 0x007FFFFFu));
    }
    int shift = 926 - eff;                  // q = round(|a| / 2^-149), shift >= 30
    if (shift > 54) return tg_float_from_bits(sign);   // |a| < 2^-151: rounds to a signed zero
    q = m >> shift;
    rem = m & ((1ull << shift) - 1ull);
    half = 1ull << (shift - 1);
    if (rem > half || (rem == half && (q & 1ull))) ++q;
    return tg_float_from_bits(sign | (unsigned int)q);   // q = 2^23 is 2^-126, the smallest normal
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
// f64(x), x = min(|g|, clip_bound) with NumPy's np.minimum semantics (a NaN operand gives NaN);
// for finite values it is fminf. clip_bound = +inf means "no clipping". Compared in double (the
// widening is exact and order-preserving, so the result is f64 of the float32 minimum).
TG_HD double tg_clip_abs(float g, float clip_bound) {
    double x = tg_f2d(tg_fabs(g));
    if (x != x) return x;
    double c = tg_f2d(clip_bound);
    return x < c ? x : c;   // a NaN bound fails the test and is returned
}

// code in {-1, 0, +1} of one element from its Philox word:
//   t = word >> 8 (top 24 bits); nonzero iff f64(t) * f64(s) < f64(x) * 2^24 (both products exact);
//   sign +1 iff g > 0.
TG_HD int tg_ternary_code(float g, unsigned int word, float s, float clip_bound) {
    unsigned int t = word >> 8;
    double x = tg_clip_abs(g, clip_bound);
    bool keep = tg_dmul((double)t, tg_f2d(s)) < tg_dmul(x, 16777216.0);
    return keep ? (tg_f2d(g) > 0.0 ? 1 : -1) : 0;
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
