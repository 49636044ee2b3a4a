// sandwich_tail.cuh: the sandwich-norm step of a Gemma 4 layer run in the
// tail of the grid that wrote its addend (gemv TAIL=1), so that no norm
// launch stands between a decode projection and the next one.
//
// The step, for each of the nt rows t (width n, f32):
//   h_out[t] = (h_in[t] + rmsnorm(y[t]) * w_add) * s,   s = *scale (NULL: 1)
//   out[t]   = rmsnorm(h_out[t]) * w_out (w_out NULL: weightless), in
//              format FMT (act_out.cuh), when FMT is not NONE;
// rmsnorm(v) = v * rsqrt(mean(v^2) + eps), the sums of squares in f32:
// rmsnorm.cu's formulas with ADD=1, NORM_OUT = (FMT != NONE), summed in
// another order (y's per producing block, then over the blocks; h's over a
// loop instead of registers, so any block size holds any width). h_in and h_out may be the same buffer (the
// residual updated in place): each element is read before it is written, by
// the same thread.
//
// Protocol: every block of the grid writes its outputs' sum of squares per
// row, then calls tail_last_block once, all its threads together, after
// those stores; the one block that arrives last gets true and runs
// sandwich_rows, which sums the blocks' partials in block order and reads
// y back through L2, each pass's loads issued in batches. The
// counter is a u32 that is 0 when the grid starts; the last block sets it
// back to 0, so the next launch (stream-ordered: launches sharing a counter
// must not overlap) finds it so.
// Contract: fp against the f64 oracle of the whole chain (f32 accumulation
// of n squares); with FMT = Q8_1 or Q8_SPLIT approx (operand rounding).

#pragma once

#include "act_out.cuh"

// No normalized output (TAIL_OUT=NONE): only the residual is updated.
#define NONE 100

DEVI float4 f4_scale(float4 a, float s) { return make_float4(a.x * s, a.y * s, a.z * s, a.w * s); }
DEVI float f4_sq(float4 a) { return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w; }
DEVI float4 f4_mul(float4 a, float4 b) { return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w); }
DEVI float4 f4_add(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

// Whether this block is the last of its grid to get here. Each thread's
// stores are made visible device-wide before the block counts itself in,
// and the last block fences again before it reads what the others wrote.
DEVI bool tail_last_block(unsigned* counter) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned total = gridDim.x * gridDim.y * gridDim.z;
        last = atomicAdd(counter, 1u) == total - 1;
        // Every other block has counted itself in: the counter is free.
        if (last) atomicExch(counter, 0u);
    }
    __syncthreads();
    if (last) __threadfence();
    return last != 0;
}

// The scratch's first float of the blocks' partial sums (after the u32
// counter, 16-byte aligned).
#define TAIL_PARTIALS 4

// Loads in flight per thread and operand in the tail's passes: a pass
// issues a batch's loads together, so its latency is one L2 round trip per
// batch rather than per value.
#define TAIL_BATCH 4

// The step over rows 0..nt-1, by the whole block (blockDim.x a multiple of
// 32, n a multiple of 4; of 32 for FMT = Q8_1 or Q8_SPLIT, whose 8 lanes of
// one 32-value group write it together: the output loop runs uniformly over
// the warp, padding lanes passing `valid` = false). `partial[b * nt + t]`
// is block b's sum of y[t]^2 over its rows (b < nblocks): their sum, in
// block order, is y[t]'s.
template <int FMT>
DEVI void sandwich_rows(const float* y, int nt, int n, const float* partial, int nblocks, const float* h_in,
                        float* h_out, const float* __restrict__ w_add, const float* __restrict__ scale,
                        const float* __restrict__ w_out, void* out, float2* out_ds, float eps) {
    __shared__ float red[32];
    const int n4 = n / 4;
    const int bd = blockDim.x;
    const float s = scale ? __ldg(scale) : 1.0f;
    const float4* wa4 = reinterpret_cast<const float4*>(w_add);
    const float4* wo4 = reinterpret_cast<const float4*>(w_out);
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int t = 0; t < nt; ++t) {
        const float4* y4 = reinterpret_cast<const float4*>(y + (u64)t * n);
        const float4* hi4 = reinterpret_cast<const float4*>(h_in + (u64)t * n);
        float4* ho4 = reinterpret_cast<float4*>(h_out + (u64)t * n);
        float ss = 0.0f;
        for (int b0 = threadIdx.x; b0 < nblocks; b0 += TAIL_BATCH * 2 * bd) {
            float p[TAIL_BATCH * 2];
#pragma unroll
            for (int j = 0; j < TAIL_BATCH * 2; ++j) {
                const int b = b0 + j * bd;
                p[j] = b < nblocks ? __ldcg(partial + (u64)b * nt + t) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < TAIL_BATCH * 2; ++j) ss += p[j];
        }
        const float ry = rsqrtf(block_sum(ss, red) / (float)n + eps);
        // A batch's loads all precede its stores: h_in may be h_out, each
        // element read and then written by the same thread.
        float sh = 0.0f;
        for (int c0 = threadIdx.x; c0 < n4; c0 += TAIL_BATCH * bd) {
            float4 v[TAIL_BATCH], h[TAIL_BATCH], wa[TAIL_BATCH];
#pragma unroll
            for (int j = 0; j < TAIL_BATCH; ++j) {
                const int c = c0 + j * bd;
                const bool in = c < n4;
                v[j] = in ? __ldcg(y4 + c) : zero;
                h[j] = in ? __ldcg(hi4 + c) : zero;
                wa[j] = in ? __ldg(wa4 + c) : zero;
            }
#pragma unroll
            for (int j = 0; j < TAIL_BATCH; ++j) {
                const int c = c0 + j * bd;
                if (c < n4) {
                    const float4 r = f4_scale(f4_add(h[j], f4_mul(f4_scale(v[j], ry), wa[j])), s);
                    ho4[c] = r;
                    sh += f4_sq(r);
                }
            }
        }
        if constexpr (FMT != NONE) {
            const float rh = rsqrtf(block_sum(sh, red) / (float)n + eps);
            for (int c0 = 0; c0 < n4; c0 += TAIL_BATCH * bd) {
                float4 o[TAIL_BATCH], wo[TAIL_BATCH];
#pragma unroll
                for (int j = 0; j < TAIL_BATCH; ++j) {
                    const int c = c0 + j * bd + threadIdx.x;
                    const bool in = c < n4;
                    // This thread's own stores of the pass above.
                    o[j] = in ? ho4[c] : zero;
                    wo[j] = in && w_out ? __ldg(wo4 + c) : make_float4(1.f, 1.f, 1.f, 1.f);
                }
#pragma unroll
                for (int j = 0; j < TAIL_BATCH; ++j) {
                    const int c = c0 + j * bd + threadIdx.x;
                    // Uniform per warp: c0 + j * bd is a multiple of 32.
                    if (c0 + j * bd >= n4) break;
                    act_write4_as<FMT>(out, out_ds, (u64)t * n + (u64)c * 4, f4_mul(f4_scale(o[j], rh), wo[j]),
                                       c < n4);
                }
            }
        } else {
            (void)sh, (void)w_out, (void)out, (void)out_ds;
        }
    }
}
