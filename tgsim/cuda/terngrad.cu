// TernGrad codec kernels: lane-ordered moments, fused ternarize+pack (2-bit, base-3), and the
// LUT-decoding weighted sum / code sum with payload validation.
//
// Every kernel is a grid-stride loop over "logical threads" that calls one __host__ __device__
// body function with the logical thread index. tgsim/cuda/host_harness.cu runs the same body
// functions on the CPU by looping over those indices, which is how the kernel logic is tested
// against the NumPy reference without a GPU (tests/test_cuda_kernels.py). The result never
// depends on the launch configuration.
//
// Loaded by tgsim/codecs/terngrad/cuda.py with cupy.RawModule (NVRTC, -fmad=false; CuPy appends
// -ftz=true, which cannot change a result: there is no float32 instruction, see philox.cuh); the
// #include below is replaced by the header's text there, so the module is one self-contained source.
#include "philox.cuh"

#define TG_GRID_STRIDE(t, count)                                                       \
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < (count); \
         t += (long long)gridDim.x * blockDim.x)

// ---------------------------------------------------------------------------------------------
// logical thread counts (the host wrapper and the harness use the same numbers)
// ---------------------------------------------------------------------------------------------
TG_HD long long tg_encode_2bit_threads(long long n) { return (n + 3) / 4; }            // 1 byte each
TG_HD long long tg_encode_base3_threads(long long n) { return ((n + 4) / 5 + 3) / 4; } // 4 bytes each

// ---------------------------------------------------------------------------------------------
// moments (stats.lane_sums / layer_moments)
// ---------------------------------------------------------------------------------------------
// Lane j: d_i = f64(g_i) - K (K = f64(g[0])) summed over i = j, j + LANES, ... ascending, and
// d_i * d_i likewise; absmax of the lane; any non-finite element sets *nonfinite.
TG_HD void tg_moments_lane(long long j, const float* g, long long n, double* s1, double* s2,
                           float* absmax_lanes, int* nonfinite) {
    double k = n > 0 ? tg_f2d(g[0]) : 0.0;
    double a1 = 0.0, a2 = 0.0;
    float amax = 0.0f;
    bool bad = false;
    for (long long i = j; i < n; i += TG_LANES) {
        float v = g[i];
        double d = tg_dsub(tg_f2d(v), k);
        a1 = tg_dadd(a1, d);
        a2 = tg_dadd(a2, tg_dmul(d, d));
        float av = tg_fabs(v);
        if (tg_f2d(av) > tg_f2d(amax)) amax = av;   // compared in double: no .f32 (FTZ) compare
        if (!tg_isfinite(v)) bad = true;
    }
    s1[j] = a1;
    s2[j] = a2;
    absmax_lanes[j] = amax;
    if (bad) {
#ifdef __CUDA_ARCH__
        atomicOr(nonfinite, 1);
#else
        *nonfinite = 1;
#endif
    }
}

// One node of the pairwise tree level h: a[i] <- a[i] + a[i + h] (i < h); max for absmax.
TG_HD void tg_tree_node(long long i, long long h, double* s1, double* s2, float* absmax_lanes) {
    s1[i] = tg_dadd(s1[i], s1[i + h]);
    s2[i] = tg_dadd(s2[i], s2[i + h]);
    float b = absmax_lanes[i + h];
    if (tg_f2d(b) > tg_f2d(absmax_lanes[i])) absmax_lanes[i] = b;
}

extern "C" __global__ void tg_moments_lanes(const float* g, long long n, double* s1, double* s2,
                                            float* absmax_lanes, int* nonfinite) {
    TG_GRID_STRIDE(j, (long long)TG_LANES) tg_moments_lane(j, g, n, s1, s2, absmax_lanes, nonfinite);
}

// The fixed tree over `lanes` (a power of two) partials, in place; launch with ONE block.
// Result in s1[0], s2[0], absmax_lanes[0].
extern "C" __global__ void tg_moments_tree(double* s1, double* s2, float* absmax_lanes, int lanes) {
    if (blockIdx.x != 0) return;
    for (long long h = lanes / 2; h >= 1; h /= 2) {
        for (long long i = threadIdx.x; i < h; i += blockDim.x) tg_tree_node(i, h, s1, s2, absmax_lanes);
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------------
// fused ternarize + pack (ternary.ternarize + packing.pack)
// ---------------------------------------------------------------------------------------------
// 2-bit: logical thread j writes byte j = Philox block j = elements 4j .. 4j+3.
TG_HD void tg_encode_2bit_byte(long long j, const float* g, long long n, float s, float clip_bound,
                               unsigned int k0, unsigned int k1, unsigned int layer,
                               unsigned int worker, unsigned int step, unsigned char* out) {
    unsigned int w[4];
    tg_stream_block((unsigned int)j, k0, k1, layer, worker, step, w);
    unsigned int byte = 0;
    for (int m = 0; m < 4; ++m) {
        long long i = 4 * j + m;
        int code = i < n ? tg_ternary_code(g[i], w[m], s, clip_bound) : 0;   // pad code 0
        byte |= (unsigned int)(code + 1) << (2 * m);
    }
    out[j] = (unsigned char)byte;
}

// base-3: logical thread q writes bytes 4q .. 4q+3 = elements 20q .. 20q+19 = Philox blocks
// 5q .. 5q+4; byte b = sum_m (code_{5b+m} + 1) * 3^m.
TG_HD void tg_encode_base3_quad(long long q, const float* g, long long n, float s, float clip_bound,
                                unsigned int k0, unsigned int k1, unsigned int layer,
                                unsigned int worker, unsigned int step, unsigned char* out) {
    long long nbytes = (n + 4) / 5;
    long long e0 = 20 * q;
    unsigned int w[20];
    for (int blk = 0; blk < 5; ++blk) {
        if (e0 + 4 * blk < n)
            tg_stream_block((unsigned int)(5 * q + blk), k0, k1, layer, worker, step, w + 4 * blk);
        else
            w[4 * blk] = w[4 * blk + 1] = w[4 * blk + 2] = w[4 * blk + 3] = 0u;   // never used
    }
    for (int r = 0; r < 4; ++r) {
        long long b = 4 * q + r;
        if (b >= nbytes) break;
        unsigned int byte = 0, p = 1;
        for (int m = 0; m < 5; ++m) {
            int l = 5 * r + m;
            long long i = e0 + l;
            int code = i < n ? tg_ternary_code(g[i], w[l], s, clip_bound) : 0;
            byte += (unsigned int)(code + 1) * p;
            p *= 3u;
        }
        out[b] = (unsigned char)byte;
    }
}

extern "C" __global__ void tg_encode_2bit(const float* g, long long n, float s, float clip_bound,
                                          unsigned int k0, unsigned int k1, unsigned int layer,
                                          unsigned int worker, unsigned int step, unsigned char* out) {
    TG_GRID_STRIDE(j, tg_encode_2bit_threads(n))
        tg_encode_2bit_byte(j, g, n, s, clip_bound, k0, k1, layer, worker, step, out);
}

extern "C" __global__ void tg_encode_base3(const float* g, long long n, float s, float clip_bound,
                                           unsigned int k0, unsigned int k1, unsigned int layer,
                                           unsigned int worker, unsigned int step, unsigned char* out) {
    TG_GRID_STRIDE(q, tg_encode_base3_threads(n))
        tg_encode_base3_quad(q, g, n, s, clip_bound, k0, k1, layer, worker, step, out);
}

// ---------------------------------------------------------------------------------------------
// decoding: weighted sum and integer code sum (packing.weighted_sum / sum_codes), with the
// checks of packing.check_payload. payloads is (workers, nbytes) row-major, nbytes = ceil(n/k).
// An invalid byte (a 0b11 code, a base-3 byte > 242, or a non-zero pad code past element n) of
// worker w at byte b lowers *first_bad to w * nbytes + b (start it at TG_NO_BAD).
// ---------------------------------------------------------------------------------------------
TG_HD void tg_record_bad(unsigned long long* first_bad, unsigned long long idx) {
#ifdef __CUDA_ARCH__
    atomicMin(first_bad, idx);
#else
    if (idx < *first_bad) *first_bad = idx;
#endif
}

// codes of byte b of worker w (K codes per byte); invalid bytes decode to zeros and are recorded.
template <int K>
TG_HD void tg_payload_codes(const unsigned char* payloads, long long nbytes, int w, long long b,
                            long long n, int codes[5], unsigned long long* first_bad) {
    bool ok = tg_decode_byte(payloads[(long long)w * nbytes + b], K == 4 ? TG_FMT_2BIT : TG_FMT_BASE3, codes);
    for (int m = 0; m < K; ++m)
        if (b * K + m >= n && codes[m] != 0) ok = false;
    if (!ok) tg_record_bad(first_bad, (unsigned long long)w * (unsigned long long)nbytes + (unsigned long long)b);
}

// out[i] = f32((sum_w f64(s_w) * code_w[i], ascending w, from 0.0) * inv_divide_by) for the
// K elements of byte b.
template <int K>
TG_HD void tg_weighted_sum_byte_k(long long b, const unsigned char* payloads, int workers, long long nbytes,
                                  const float* scalers, long long n, double inv_divide_by, float* out,
                                  unsigned long long* first_bad) {
    double acc[K];
    int codes[5];
    for (int m = 0; m < K; ++m) acc[m] = 0.0;
    for (int w = 0; w < workers; ++w) {
        tg_payload_codes<K>(payloads, nbytes, w, b, n, codes, first_bad);
        double s = tg_f2d(scalers[w]);   // exact for denormal scalers too (no FTZ)
        for (int m = 0; m < K; ++m) acc[m] = tg_dadd(acc[m], tg_dmul(s, (double)codes[m]));
    }
    for (int m = 0; m < K; ++m) {
        long long i = b * K + m;
        if (i < n) out[i] = tg_d2f(tg_dmul(acc[m], inv_divide_by));
    }
}

TG_HD void tg_weighted_sum_byte(long long b, const unsigned char* payloads, int workers, long long nbytes,
                                const float* scalers, long long n, int fmt, double inv_divide_by,
                                float* out, unsigned long long* first_bad) {
    if (fmt == TG_FMT_2BIT)
        tg_weighted_sum_byte_k<4>(b, payloads, workers, nbytes, scalers, n, inv_divide_by, out, first_bad);
    else
        tg_weighted_sum_byte_k<5>(b, payloads, workers, nbytes, scalers, n, inv_divide_by, out, first_bad);
}

// out[i] = sum_w code_w[i] as int (the wrapper casts to the requested dtype).
template <int K>
TG_HD void tg_sum_codes_byte_k(long long b, const unsigned char* payloads, int workers, long long nbytes,
                               long long n, int* out, unsigned long long* first_bad) {
    int acc[K];
    int codes[5];
    for (int m = 0; m < K; ++m) acc[m] = 0;
    for (int w = 0; w < workers; ++w) {
        tg_payload_codes<K>(payloads, nbytes, w, b, n, codes, first_bad);
        for (int m = 0; m < K; ++m) acc[m] += codes[m];
    }
    for (int m = 0; m < K; ++m) {
        long long i = b * K + m;
        if (i < n) out[i] = acc[m];
    }
}

TG_HD void tg_sum_codes_byte(long long b, const unsigned char* payloads, int workers, long long nbytes,
                             long long n, int fmt, int* out, unsigned long long* first_bad) {
    if (fmt == TG_FMT_2BIT)
        tg_sum_codes_byte_k<4>(b, payloads, workers, nbytes, n, out, first_bad);
    else
        tg_sum_codes_byte_k<5>(b, payloads, workers, nbytes, n, out, first_bad);
}

extern "C" __global__ void tg_weighted_sum(const unsigned char* payloads, int workers, long long nbytes,
                                           const float* scalers, long long n, int fmt, double inv_divide_by,
                                           float* out, unsigned long long* first_bad) {
    TG_GRID_STRIDE(b, nbytes)
        tg_weighted_sum_byte(b, payloads, workers, nbytes, scalers, n, fmt, inv_divide_by, out, first_bad);
}

extern "C" __global__ void tg_sum_codes(const unsigned char* payloads, int workers, long long nbytes,
                                        long long n, int fmt, int* out, unsigned long long* first_bad) {
    TG_GRID_STRIDE(b, nbytes) tg_sum_codes_byte(b, payloads, workers, nbytes, n, fmt, out, first_bad);
}

// ---------------------------------------------------------------------------------------------
// whole-step kernels: many (worker, layer) rows in one launch, as apex's
// multi_tensor_apply does for optimizers: a table of device pointers and sizes, one launch over all
// rows, no host round trip between rows. Same bits as the one-row kernels above.
// ---------------------------------------------------------------------------------------------
// moments of one row in ONE block of TG_ROW_THREADS threads, in the order of moments.py:
// thread t owns lanes t + TG_ROW_THREADS*k (k < TG_ROW_LANES_PER_THREAD = LANES / TG_ROW_THREADS).
// The tree levels h = LANES/2 .. TG_ROW_THREADS pair lane t + TG_ROW_THREADS*k with
// t + TG_ROW_THREADS*(k + h/TG_ROW_THREADS): both are the thread's own, so it runs those levels on
// its own partials (q[k] += q[k + m], m = 32 .. 1); levels h = TG_ROW_THREADS/2 .. 1 are the block's
// shared-memory tree over the threads' results. Same pairs in the same order as tg_moments_lanes +
// tg_moments_tree, so the same bits.
#define TG_ROW_THREADS 1024
#define TG_ROW_LANES_PER_THREAD (TG_LANES / TG_ROW_THREADS)

TG_HD void tg_row_thread_sums(int t, const float* g, long long n, double* out1, double* out2, float* out_amax,
                              int* nonfinite) {
    double q1[TG_ROW_LANES_PER_THREAD], q2[TG_ROW_LANES_PER_THREAD];
    double k = n > 0 ? tg_f2d(g[0]) : 0.0;
    float amax = 0.0f;
    bool bad = false;
    for (int c = 0; c < TG_ROW_LANES_PER_THREAD; ++c) {
        double a1 = 0.0, a2 = 0.0;
        for (long long i = t + (long long)TG_ROW_THREADS * c; i < n; i += TG_LANES) {
            float v = g[i];
            double d = tg_dsub(tg_f2d(v), k);
            a1 = tg_dadd(a1, d);
            a2 = tg_dadd(a2, tg_dmul(d, d));
            float av = tg_fabs(v);
            if (tg_f2d(av) > tg_f2d(amax)) amax = av;
            if (!tg_isfinite(v)) bad = true;
        }
        q1[c] = a1;
        q2[c] = a2;
    }
    for (int m = TG_ROW_LANES_PER_THREAD / 2; m >= 1; m /= 2)
        for (int c = 0; c < m; ++c) {
            q1[c] = tg_dadd(q1[c], q1[c + m]);
            q2[c] = tg_dadd(q2[c], q2[c + m]);
        }
    *out1 = q1[0];
    *out2 = q2[0];
    *out_amax = amax;
    if (bad) {
#ifdef __CUDA_ARCH__
        atomicOr(nonfinite, 1);
#else
        *nonfinite = 1;
#endif
    }
}

// rows[r]: device address of row r's float32 elements (sizes[r] of them). Writes s1[r], s2[r]
// (the tree's totals), absmax[r], and sets nonfinite[r] (start it at 0). Launch with
// TG_ROW_THREADS threads a block; blocks stride over the rows.
extern "C" __global__ void tg_moments_rows(const unsigned long long* rows, const long long* sizes, int count,
                                           double* s1, double* s2, float* absmax, int* nonfinite) {
#ifdef __CUDA_ARCH__
    __shared__ double sh1[TG_ROW_THREADS], sh2[TG_ROW_THREADS];
    __shared__ float sha[TG_ROW_THREADS];
    int t = threadIdx.x;
    for (int r = blockIdx.x; r < count; r += gridDim.x) {
        tg_row_thread_sums(t, (const float*)rows[r], sizes[r], sh1 + t, sh2 + t, sha + t, nonfinite + r);
        __syncthreads();
        for (int h = TG_ROW_THREADS / 2; h >= 1; h /= 2) {
            if (t < h) tg_tree_node(t, h, sh1, sh2, sha);
            __syncthreads();
        }
        if (t == 0) {
            s1[r] = sh1[0];
            s2[r] = sh2[0];
            absmax[r] = sha[0];
        }
        __syncthreads();
    }
#endif
}

// Logical threads of the rows' encode, concatenated: row r owns [starts[r], starts[r + 1]);
// the row of logical thread j (starts ascending, starts[0] = 0): binary search.
TG_HD int tg_row_of(const long long* starts, int count, long long j) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (starts[mid] <= j) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// One logical thread of the rows' encode: row r = the one owning j; row r is layer layers[r] of
// worker workers[r], elements rows[r] (sizes[r]), scaler scalers[r], clip bound clip_bounds[r], its
// payload at out[r]; the key (k0, k1) and step are the step's. fmt: TG_FMT_2BIT / TG_FMT_BASE3.
TG_HD void tg_encode_rows_thread(long long j, const unsigned long long* rows, const long long* sizes,
                                 const float* scalers, const float* clip_bounds, const unsigned int* layers,
                                 const unsigned int* workers, const unsigned long long* out,
                                 const long long* starts, int count, int fmt, unsigned int k0, unsigned int k1,
                                 unsigned int step) {
    int r = tg_row_of(starts, count, j);
    long long local = j - starts[r];
    const float* g = (const float*)rows[r];
    unsigned char* o = (unsigned char*)out[r];
    if (fmt == TG_FMT_2BIT)
        tg_encode_2bit_byte(local, g, sizes[r], scalers[r], clip_bounds[r], k0, k1, layers[r], workers[r], step, o);
    else
        tg_encode_base3_quad(local, g, sizes[r], scalers[r], clip_bounds[r], k0, k1, layers[r], workers[r], step, o);
}

// starts has count + 1 entries; starts[count] is the total of logical threads
// (tg_encode_2bit_threads / tg_encode_base3_threads of each row's size, summed in row order).
extern "C" __global__ void tg_encode_rows(const unsigned long long* rows, const long long* sizes,
                                          const float* scalers, const float* clip_bounds,
                                          const unsigned int* layers, const unsigned int* workers,
                                          const unsigned long long* out, const long long* starts, int count,
                                          int fmt, unsigned int k0, unsigned int k1, unsigned int step) {
    TG_GRID_STRIDE(j, starts[count])
        tg_encode_rows_thread(j, rows, sizes, scalers, clip_bounds, layers, workers, out, starts, count, fmt,
                              k0, k1, step);
}

// One logical thread of the rows' weighted sum: row r (a layer) has the (workers, nbytes[r]) payloads
// at payloads[r], the workers' scalers at scalers + r * workers, sizes[r] elements, its float32 result
// at out[r] and its own first_bad[r]; byte j - starts[r] of it, as tg_weighted_sum_byte.
TG_HD void tg_weighted_sum_rows_thread(long long j, const unsigned long long* payloads, const long long* nbytes,
                                       const long long* sizes, const float* scalers, int workers, int fmt,
                                       double inv_divide_by, const unsigned long long* out,
                                       const long long* starts, int count, unsigned long long* first_bad) {
    int r = tg_row_of(starts, count, j);
    tg_weighted_sum_byte(j - starts[r], (const unsigned char*)payloads[r], workers, nbytes[r],
                         scalers + (long long)r * workers, sizes[r], fmt, inv_divide_by, (float*)out[r],
                         first_bad + r);
}

// starts: count + 1 entries, starts[r + 1] - starts[r] = nbytes[r].
extern "C" __global__ void tg_weighted_sum_rows(const unsigned long long* payloads, const long long* nbytes,
                                                const long long* sizes, const float* scalers, int workers,
                                                int fmt, double inv_divide_by, const unsigned long long* out,
                                                const long long* starts, int count,
                                                unsigned long long* first_bad) {
    TG_GRID_STRIDE(j, starts[count])
        tg_weighted_sum_rows_thread(j, payloads, nbytes, sizes, scalers, workers, fmt, inv_divide_by, out, starts,
                                    count, first_bad);
}
