// rmsnorm.cu: the sandwich-norm step of a Gemma 4 layer in one pass.
//
// For each row r of `rows` (width `width`, f32):
//   ADD = 1:      h[r] = (h[r] + rmsnorm(y[r]) * w_add) * s,  s = *scale (NULL: 1)
//                 (the residual add of the attention/FFN/PLE output, with
//                 the layer scalar when given), h updated in place;
//   NORM_OUT = 1: out[r] = rmsnorm(h[r]) * w_out (w_out NULL: weightless),
//                 written in the OUT format (act_out.cuh) for the next GEMM.
//   SUM_IN = 1 (with ADD): the addend is itself a sum of two normalized
//                 rows, y[r] := rmsnorm(y[r]) * w_y + rmsnorm(y2[r]) * w_y2
//                 (a mixture-of-experts layer's shared-MLP and expert
//                 outputs with their post norms), then added as above.
//   OUTS = 3 (with NORM_OUT): also out2[r] = rmsnorm(h[r]) * w_out2 and
//                 out3[r] = rmsnorm(h[r]) * w_out3, f32 (a NULL out2 / out3
//                 is skipped): the router input and the experts' input norm
//                 of a mixture-of-experts layer, from the one sum of squares.
// rmsnorm(v) = v * rsqrt(mean(v^2) + eps); the sum of squares is an f32
// block reduction.
//
// Grid: one block per row (grid.x = rows), THREADS threads; thread t holds
// the float4s t, t + THREADS, ... of its row in registers (at most 8), so a
// row is read once and written once per output. Each norm is one block
// reduction (SUM_IN adds two before the add's own).
// Contract: fp against the f64 oracle (f32 accumulation of width squares);
// with OUT = Q8_1 or DQ_* approx (operand rounding) and tight against the
// CPU replay of the format conversion.
//
// Defines:
//   ADD       0 | 1: add the normalized y into h (times the layer scalar)
//   NORM_OUT  0 | 1: write the normalized h in the OUT format
//   OUT       F32 | Q8_1 | DQ_F16 | DQ_BF16
//   SUM_IN    0 | 1: the addend is rmsnorm(y) * w_y + rmsnorm(y2) * w_y2 (ADD=1)
//   OUTS      1 | 3: normalized outputs of h (3: out2 and out3 in f32; NORM_OUT=1)
//   THREADS   threads per block (row), a multiple of 32, at most 1024

#ifndef ADD
#error "rmsnorm.cu needs ADD"
#endif
#ifndef NORM_OUT
#error "rmsnorm.cu needs NORM_OUT"
#endif
#ifndef OUT
#error "rmsnorm.cu needs OUT"
#endif
#ifndef THREADS
#error "rmsnorm.cu needs THREADS"
#endif
#ifndef SUM_IN
#error "rmsnorm.cu needs SUM_IN"
#endif
#ifndef OUTS
#error "rmsnorm.cu needs OUTS"
#endif
#if SUM_IN && !ADD
#error "rmsnorm.cu: SUM_IN needs ADD=1"
#endif
#if OUTS != 1 && !(OUTS == 3 && NORM_OUT)
#error "rmsnorm.cu: OUTS must be 1, or 3 with NORM_OUT=1"
#endif

#include "common.cuh"
#include "act_out.cuh"
#include "sandwich_tail.cuh"

#define MAXV 8

extern "C" __global__ void __launch_bounds__(THREADS)
rmsnorm(float* __restrict__ h, const float* __restrict__ y, const float* __restrict__ w_add,
        const float* __restrict__ scale, const float* __restrict__ w_out, void* __restrict__ out,
        float2* __restrict__ out_ds, const float* __restrict__ y2, const float* __restrict__ w_y,
        const float* __restrict__ w_y2, float* __restrict__ out2, const float* __restrict__ w_out2,
        float* __restrict__ out3, const float* __restrict__ w_out3, int rows, int width, float eps) {
    pdl_enter();
    __shared__ float red[THREADS / 32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const int n4 = width / 4;
    const u64 base = (u64)r * width;
    float4 v[MAXV];
#if ADD
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < MAXV; ++j) {
        const int c = j * THREADS + threadIdx.x;
        v[j] = c < n4 ? reinterpret_cast<const float4*>(y + base)[c] : make_float4(0.f, 0.f, 0.f, 0.f);
        ss += f4_sq(v[j]);
    }
#if SUM_IN
    {
        float4 v2[MAXV];
        float ss2 = 0.0f;
#pragma unroll
        for (int j = 0; j < MAXV; ++j) {
            const int c = j * THREADS + threadIdx.x;
            v2[j] = c < n4 ? reinterpret_cast<const float4*>(y2 + base)[c] : make_float4(0.f, 0.f, 0.f, 0.f);
            ss2 += f4_sq(v2[j]);
        }
        const float r1 = rsqrtf(block_sum(ss, red) / (float)width + eps);
        const float r2 = rsqrtf(block_sum(ss2, red) / (float)width + eps);
        ss = 0.0f;
#pragma unroll
        for (int j = 0; j < MAXV; ++j) {
            const int c = j * THREADS + threadIdx.x;
            if (c < n4) {
                const float4 a = f4_mul(f4_scale(v[j], r1), reinterpret_cast<const float4*>(w_y)[c]);
                const float4 b = f4_mul(f4_scale(v2[j], r2), reinterpret_cast<const float4*>(w_y2)[c]);
                v[j] = f4_add(a, b);
            }
            ss += f4_sq(v[j]);
        }
    }
#else
    (void)y2;
    (void)w_y;
    (void)w_y2;
#endif
    const float ry = rsqrtf(block_sum(ss, red) / (float)width + eps);
    const float s = scale ? *scale : 1.0f;
#pragma unroll
    for (int j = 0; j < MAXV; ++j) {
        const int c = j * THREADS + threadIdx.x;
        if (c < n4) {
            const float4 wa = reinterpret_cast<const float4*>(w_add)[c];
            const float4 hv = reinterpret_cast<const float4*>(h + base)[c];
            v[j] = f4_scale(f4_add(hv, f4_mul(f4_scale(v[j], ry), wa)), s);
            reinterpret_cast<float4*>(h + base)[c] = v[j];
        }
    }
#else
    (void)y2;
    (void)w_y;
    (void)w_y2;
#pragma unroll
    for (int j = 0; j < MAXV; ++j) {
        const int c = j * THREADS + threadIdx.x;
        v[j] = c < n4 ? reinterpret_cast<const float4*>(h + base)[c] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#endif
#if NORM_OUT
    float ss2 = 0.0f;
#pragma unroll
    for (int j = 0; j < MAXV; ++j) ss2 += f4_sq(v[j]);
    const float rh = rsqrtf(block_sum(ss2, red) / (float)width + eps);
#pragma unroll
    for (int j = 0; j < MAXV; ++j) {
        const int c = j * THREADS + threadIdx.x;
        // Uniform per warp: a chunk is either wholly inside the row for an
        // aligned group of 8 lanes (width % 32 == 0 for Q8_1) or padding.
        if (j * THREADS >= n4) break;
        const bool valid = c < n4;
        float4 o = f4_scale(v[j], rh);
        if (valid && w_out) o = f4_mul(o, reinterpret_cast<const float4*>(w_out)[c]);
        act_write4(out, out_ds, base + (u64)c * 4, o, valid);
    }
#if OUTS == 3
#pragma unroll
    for (int j = 0; j < MAXV; ++j) {
        const int c = j * THREADS + threadIdx.x;
        if (c < n4) {
            const float4 o = f4_scale(v[j], rh);
            if (out2)
                reinterpret_cast<float4*>(out2 + base)[c] = f4_mul(o, reinterpret_cast<const float4*>(w_out2)[c]);
            if (out3)
                reinterpret_cast<float4*>(out3 + base)[c] = f4_mul(o, reinterpret_cast<const float4*>(w_out3)[c]);
        }
    }
#else
    (void)out2;
    (void)w_out2;
    (void)out3;
    (void)w_out3;
#endif
#else
    (void)out2;
    (void)w_out2;
    (void)out3;
    (void)w_out3;
#endif
}
