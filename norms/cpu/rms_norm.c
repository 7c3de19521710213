// RMSNorm and pRMSNorm for float32 CPU tensors: one pass over memory forward, one backward.
//
// Rows are split across the OpenMP threads (torch's own runtime: the library is loaded after
// torch, so libgomp.so.1 resolves to the copy torch already uses). Forward: per row, the mean of
// squares of the first k features (float32, SIMD lanes), then y = x * rstd * gain, while the row
// is still in cache; rstd is saved. Backward: per row, dot = sum(dy * gain * x), then
//     dx_j = rstd * dy_j * gain_j - [j < k] * x_j * rstd^3 * dot / k
// and each thread accumulates its share of dw_j = sum_rows dy_j * x_j * rstd in its own row of
// dw_partial (no atomics; one row per thread), which the caller sums. gain_mode: 0 = w, 1 = 1 + w,
// 2 = no gain.
#include <math.h>
#include <omp.h>
#include <stdint.h>

static inline float gain_at(const float* w, int64_t j, int gain_mode) {
    return gain_mode == 2 ? 1.0f : (gain_mode == 1 ? 1.0f + w[j] : w[j]);
}

void rms_norm_fwd_f32(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim,
                      int64_t k, float eps, int gain_mode, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * dim;
        float* yr = y + r * dim;
        float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
        for (int64_t j = 0; j < k; j++) squares += xr[j] * xr[j];
        const float s = 1.0f / sqrtf(squares / (float)k + eps);
        rstd[r] = s;
        if (gain_mode == 2) {
#pragma omp simd
            for (int64_t j = 0; j < dim; j++) yr[j] = xr[j] * s;
        } else if (gain_mode == 1) {
#pragma omp simd
            for (int64_t j = 0; j < dim; j++) yr[j] = (xr[j] * s) * (1.0f + w[j]);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < dim; j++) yr[j] = (xr[j] * s) * w[j];
        }
    }
}

// The backward for one gain mode: always inlined with a constant mode, so each loop is branch-free.
static inline __attribute__((always_inline)) void bwd_rows(const float* dy, const float* x, const float* w,
                                                           const float* rstd, float* dx, float* dw_partial,
                                                           int64_t rows, int64_t dim, int64_t k, const int gain_mode,
                                                           int threads) {
#pragma omp parallel num_threads(threads)
    {
        float* dw = dw_partial + (int64_t)omp_get_thread_num() * dim;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float* xr = x + r * dim;
            const float* dyr = dy + r * dim;
            float* dxr = dx + r * dim;
            const float s = rstd[r];
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t j = 0; j < dim; j++) dot += dyr[j] * gain_at(w, j, gain_mode) * xr[j];
            const float coef = s * s * s * dot / (float)k;
            // dx (and this thread's dw) while the row is in cache.
#pragma omp simd
            for (int64_t j = 0; j < k; j++) {
                dxr[j] = s * dyr[j] * gain_at(w, j, gain_mode) - xr[j] * coef;
                if (gain_mode != 2) dw[j] += dyr[j] * xr[j] * s;
            }
#pragma omp simd
            for (int64_t j = k; j < dim; j++) {
                dxr[j] = s * dyr[j] * gain_at(w, j, gain_mode);
                if (gain_mode != 2) dw[j] += dyr[j] * xr[j] * s;
            }
        }
    }
}

void rms_norm_bwd_f32(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      float* dw_partial, int64_t rows, int64_t dim, int64_t k, int gain_mode, int threads) {
    switch (gain_mode) {
        case 0: bwd_rows(dy, x, w, rstd, dx, dw_partial, rows, dim, k, 0, threads); break;
        case 1: bwd_rows(dy, x, w, rstd, dx, dw_partial, rows, dim, k, 1, threads); break;
        default: bwd_rows(dy, x, w, rstd, dx, dw_partial, rows, dim, k, 2, threads); break;
    }
}

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

// Flush subnormal floats to zero (FTZ and DAZ) on every thread of the OpenMP pool that torch and
// these kernels share. Subnormal values (a post-norm model's vanishing gradients at a high learning
// rate) make every floating-point op 10-30x slower on x86; torch.set_flush_denormal only sets the
// calling thread. A no-op elsewhere.
void flush_denormals(int threads) {
#if defined(__x86_64__)
#pragma omp parallel num_threads(threads)
    _mm_setcsr(_mm_getcsr() | 0x8040);
#else
    (void)threads;
#endif
}
