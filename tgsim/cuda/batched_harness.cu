// CPU harness for the batch-invariant model kernels (batched.cu; tests/test_cuda_batched.py).
//
// Build (the test does this once per session):
//   nvcc -O2 -shared -Xcompiler -fPIC,-ffp-contract=off --fmad=false -o libtgb_host.so batched_harness.cu
//
// #includes batched.cu, so the same nvcc run compiles every __global__ kernel for the device too.
// Each tgb_host_<kernel> takes exactly the arguments of kernel tgb_<kernel> and runs its body for
// every logical thread index, in order. -ffp-contract=off keeps gcc from fusing a*b+c into FMA, so
// the host bodies round each product and each sum, as the device bodies do with __f*_rn / __d*_rn.
#include "batched.cu"

#define TGB_HOST(SUF, T)                                                                             \
    void tgb_host_bmm_##SUF(const T* a, const T* b, T* out, long long N, long long M, long long K,     \
                            long long P, long long a_n, long long a_m, long long a_k, long long b_n,   \
                            long long b_k, long long b_p) {                                           \
        for (long long t = 0; t < N * M * P; ++t)                                                     \
            tgb_bmm_##SUF##_body(t, a, b, out, M, K, P, a_n, a_m, a_k, b_n, b_k, b_p);                 \
    }                                                                                                 \
    void tgb_host_sum_middle_##SUF(const T* x, T* out, long long O, long long R, long long P) {       \
        for (long long t = 0; t < O * P; ++t) tgb_sum_middle_##SUF##_body(t, x, out, R, P);            \
    }

extern "C" {
TGB_HOST(f32, float)
TGB_HOST(f64, double)
}
