// Batch-invariant products and row sums for the models on CuPy (tgsim/models/cuda_ops.py).
//
// Why: on an H100 a worker's loss computed in a batch of 3 workers differed from the same worker's
// loss computed alone (least squares: 0.78489267 against 0.78489264). cuBLAS and CuPy's reduction
// kernels choose their blocking, and with it the order of the additions, from the whole array's
// shape, the worker count included. Here the order is fixed per output element:
//
//   bmm:        out[n, m, p] = (((0 + a[n,m,0] b[n,0,p]) + a[n,m,1] b[n,1,p]) + ...) + a[n,m,K-1] b[n,K-1,p]
//   sum_middle: out[o, p]    = ((x[o,0,p] + x[o,1,p]) + ...) + x[o,R-1,p]        (R = 0: +0.0)
//
// every product and every sum rounded to the element type (__fmul_rn / __fadd_rn and the double
// forms: never contracted into FMA). One logical thread computes one output element, so its
// arithmetic depends only on its own operands: not on N, M, P, the strides of other elements, or the
// launch configuration. A worker's result in a batch of any size is bitwise its result alone.
// (float32 denormals: CuPy compiles with -ftz=true, so products and sums below 2^-126 flush to zero
// on the GPU. That is the same in every batch size; only CPU-vs-GPU agreement sees it.)
//
// Every kernel is a grid-stride loop over logical threads that calls one __host__ __device__ body;
// tgsim/cuda/batched_harness.cu runs the same bodies on the CPU for every logical thread
// (tests/test_cuda_batched.py checks them against a NumPy loop of the formula above).
// Strides are in elements; b's worker stride is 0 when b is one matrix shared by every worker.

#define TGB_HD __host__ __device__ inline

#define TGB_GRID_STRIDE(t, count)                                                      \
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < (count); \
         t += (long long)gridDim.x * blockDim.x)

#ifdef __CUDA_ARCH__
#define TGB_MUL_F32(x, y) __fmul_rn(x, y)
#define TGB_ADD_F32(x, y) __fadd_rn(x, y)
#define TGB_MUL_F64(x, y) __dmul_rn(x, y)
#define TGB_ADD_F64(x, y) __dadd_rn(x, y)
#else
#define TGB_MUL_F32(x, y) ((x) * (y))
#define TGB_ADD_F32(x, y) ((x) + (y))
#define TGB_MUL_F64(x, y) ((x) * (y))
#define TGB_ADD_F64(x, y) ((x) + (y))
#endif

// Logical thread t = (n*M + m)*P + p of an (N, M, P) product.
#define TGB_DEFINE(SUF, T, MUL, ADD)                                                                   \
    TGB_HD void tgb_bmm_##SUF##_body(long long t, const T* a, const T* b, T* out, long long M,         \
                                     long long K, long long P, long long a_n, long long a_m,          \
                                     long long a_k, long long b_n, long long b_k, long long b_p) {    \
        long long p = t % P, nm = t / P;                                                               \
        long long m = nm % M, n = nm / M;                                                              \
        const T* ar = a + n * a_n + m * a_m;                                                           \
        const T* bc = b + n * b_n + p * b_p;                                                           \
        T acc = (T)0;                                                                                  \
        for (long long k = 0; k < K; ++k) acc = ADD(acc, MUL(ar[k * a_k], bc[k * b_k]));             \
        out[t] = acc;                                                                                  \
    }                                                                                                  \
    TGB_HD void tgb_sum_middle_##SUF##_body(long long t, const T* x, T* out, long long R, long long P) { \
        long long p = t % P, o = t / P;                                                                \
        const T* col = x + o * R * P + p;                                                              \
        T acc = R > 0 ? col[0] : (T)0;                                                                 \
        for (long long r = 1; r < R; ++r) acc = ADD(acc, col[r * P]);                                  \
        out[t] = acc;                                                                                  \
    }                                                                                                  \
    extern "C" __global__ void tgb_bmm_##SUF(const T* a, const T* b, T* out, long long N, long long M,   \
                                            long long K, long long P, long long a_n, long long a_m,      \
                                            long long a_k, long long b_n, long long b_k, long long b_p) { \
        TGB_GRID_STRIDE(t, N * M * P) tgb_bmm_##SUF##_body(t, a, b, out, M, K, P, a_n, a_m, a_k, b_n, b_k, b_p); \
    }                                                                                                  \
    extern "C" __global__ void tgb_sum_middle_##SUF(const T* x, T* out, long long O, long long R,       \
                                                   long long P) {                                      \
        TGB_GRID_STRIDE(t, O * P) tgb_sum_middle_##SUF##_body(t, x, out, R, P);                        \
    }

TGB_DEFINE(f32, float, TGB_MUL_F32, TGB_ADD_F32)
TGB_DEFINE(f64, double, TGB_MUL_F64, TGB_ADD_F64)
