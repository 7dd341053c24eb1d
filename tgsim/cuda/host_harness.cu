// CPU harness for the CUDA kernel logic (tests/test_cuda_kernels.py; no GPU needed).
//
// Build (the test does this once per session):
//   nvcc -O2 -shared -Xcompiler -fPIC,-ffp-contract=off --fmad=false -o libtg_host.so host_harness.cu
//
// This file #includes terngrad.cu, so the same nvcc run also compiles every __global__ kernel for
// the device (a kernel that does not compile fails the build, GPU or not). Each tg_host_<kernel>
// function takes exactly the arguments of the kernel <kernel> and runs that kernel's per-thread
// body (the same __host__ __device__ function the kernel calls) for every logical thread index,
// sequentially. Host floating point: -ffp-contract=off keeps gcc from fusing a*b+c into FMA, and
// x86-64 double arithmetic is plain IEEE binary64 (SSE2), so the host bodies compute what the
// device bodies compute with the __d*_rn intrinsics.
#include "terngrad.cu"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define TG_HOST_HAS_MXCSR 1
#else
#define TG_HOST_HAS_MXCSR 0
#endif

extern "C" {

int tg_host_lanes(void) { return TG_LANES; }

// Emulation of a device that flushes denormals (CuPy compiles every RawModule with -ftz=true): on
// x86, MXCSR FTZ (bit 15) flushes denormal results and DAZ (bit 6) treats denormal inputs as zero,
// for every SSE float operation of this thread, as the GPU's .ftz instructions do for float32 (x86
// also flushes double denormals, which the GPU does not: the kernels' doubles stay normal on the
// test data). on = 1 sets both bits, on = 0 clears them. Returns 0 where there is no MXCSR.
int tg_host_flush_denormals(int on) {
#if TG_HOST_HAS_MXCSR
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(on ? (csr | 0x8040u) : (csr & ~0x8040u));
    return 1;
#else
    (void)on;
    return 0;
#endif
}

// --- building blocks --------------------------------------------------------------------------
// out[4c..4c+3] = Philox4x32-10(ctr[4c..4c+3], key (keys[2c], keys[2c+1])), c < count
void tg_host_philox(long long count, const unsigned int* ctr, const unsigned int* keys, unsigned int* out) {
    for (long long c = 0; c < count; ++c)
        tg_philox4x32_10(ctr[4 * c], ctr[4 * c + 1], ctr[4 * c + 2], ctr[4 * c + 3], keys[2 * c],
                         keys[2 * c + 1], out + 4 * c);
}

// words start .. start+n-1 of a stream (rng.random_words)
void tg_host_random_words(long long n, long long start, unsigned int k0, unsigned int k1, unsigned int layer,
                          unsigned int worker, unsigned int step, unsigned int* out) {
    unsigned int w[4];
    for (long long i = 0; i < n; ++i) {
        long long e = start + i;
        tg_stream_block((unsigned int)(e >> 2), k0, k1, layer, worker, step, w);
        out[i] = w[e & 3];
    }
}

// unpacked int8 codes (ternary.ternarize) through the element rule
void tg_host_ternary_codes(const float* g, long long n, float s, float clip_bound, unsigned int k0,
                           unsigned int k1, unsigned int layer, unsigned int worker, unsigned int step,
                           signed char* out) {
    unsigned int w[4];
    for (long long i = 0; i < n; ++i) {
        tg_stream_block((unsigned int)(i >> 2), k0, k1, layer, worker, step, w);
        out[i] = (signed char)tg_ternary_code(g[i], w[i & 3], s, clip_bound);
    }
}

// float32 <-> float64 as the kernels do it (tg_f2d / tg_d2f: integer bit work, no FTZ effect)
void tg_host_f2d(long long n, const float* in, double* out) {
    for (long long i = 0; i < n; ++i) out[i] = tg_f2d(in[i]);
}

void tg_host_d2f(long long n, const double* in, float* out) {
    for (long long i = 0; i < n; ++i) out[i] = tg_d2f(in[i]);
}

// --- the kernels, one logical thread at a time -------------------------------------------------
void tg_host_moments_lanes(const float* g, long long n, double* s1, double* s2, float* absmax_lanes,
                           int* nonfinite) {
    for (long long j = 0; j < TG_LANES; ++j) tg_moments_lane(j, g, n, s1, s2, absmax_lanes, nonfinite);
}

void tg_host_moments_tree(double* s1, double* s2, float* absmax_lanes, int lanes) {
    for (long long h = lanes / 2; h >= 1; h /= 2)
        for (long long i = 0; i < h; ++i) tg_tree_node(i, h, s1, s2, absmax_lanes);
}

void tg_host_encode_2bit(const float* g, long long n, float s, float clip_bound, unsigned int k0,
                         unsigned int k1, unsigned int layer, unsigned int worker, unsigned int step,
                         unsigned char* out) {
    for (long long j = 0; j < tg_encode_2bit_threads(n); ++j)
        tg_encode_2bit_byte(j, g, n, s, clip_bound, k0, k1, layer, worker, step, out);
}

void tg_host_encode_base3(const float* g, long long n, float s, float clip_bound, unsigned int k0,
                          unsigned int k1, unsigned int layer, unsigned int worker, unsigned int step,
                          unsigned char* out) {
    for (long long q = 0; q < tg_encode_base3_threads(n); ++q)
        tg_encode_base3_quad(q, g, n, s, clip_bound, k0, k1, layer, worker, step, out);
}

void tg_host_weighted_sum(const unsigned char* payloads, int workers, long long nbytes, const float* scalers,
                          long long n, int fmt, double inv_divide_by, float* out,
                          unsigned long long* first_bad) {
    for (long long b = 0; b < nbytes; ++b)
        tg_weighted_sum_byte(b, payloads, workers, nbytes, scalers, n, fmt, inv_divide_by, out, first_bad);
}

void tg_host_sum_codes(const unsigned char* payloads, int workers, long long nbytes, long long n, int fmt,
                       int* out, unsigned long long* first_bad) {
    for (long long b = 0; b < nbytes; ++b)
        tg_sum_codes_byte(b, payloads, workers, nbytes, n, fmt, out, first_bad);
}

// --- the whole-step kernels (rows[] / out[] hold host addresses here) ---------------------------
void tg_host_moments_rows(const unsigned long long* rows, const long long* sizes, int count, double* s1,
                          double* s2, float* absmax, int* nonfinite) {
    static double t1[TG_ROW_THREADS], t2[TG_ROW_THREADS];
    static float ta[TG_ROW_THREADS];
    for (int r = 0; r < count; ++r) {
        for (int t = 0; t < TG_ROW_THREADS; ++t)   // every thread's own lanes and levels
            tg_row_thread_sums(t, (const float*)rows[r], sizes[r], t1 + t, t2 + t, ta + t, nonfinite + r);
        for (int h = TG_ROW_THREADS / 2; h >= 1; h /= 2)   // the block's shared-memory tree
            for (int i = 0; i < h; ++i) tg_tree_node(i, h, t1, t2, ta);
        s1[r] = t1[0];
        s2[r] = t2[0];
        absmax[r] = ta[0];
    }
}

void tg_host_encode_rows(const unsigned long long* rows, const long long* sizes, const float* scalers,
                         const float* clip_bounds, const unsigned int* layers, const unsigned int* workers,
                         const unsigned long long* out, const long long* starts, int count, int fmt,
                         unsigned int k0, unsigned int k1, unsigned int step) {
    for (long long j = 0; j < starts[count]; ++j)
        tg_encode_rows_thread(j, rows, sizes, scalers, clip_bounds, layers, workers, out, starts, count, fmt,
                              k0, k1, step);
}

void tg_host_weighted_sum_rows(const unsigned long long* payloads, const long long* nbytes, const long long* sizes,
                               const float* scalers, int workers, int fmt, double inv_divide_by,
                               const unsigned long long* out, const long long* starts, int count,
                               unsigned long long* first_bad) {
    for (long long j = 0; j < starts[count]; ++j)
        tg_weighted_sum_rows_thread(j, payloads, nbytes, sizes, scalers, workers, fmt, inv_divide_by, out, starts,
                                    count, first_bad);
}

}  // extern "C"
