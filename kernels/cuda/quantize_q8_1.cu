// quantize_q8_1.cu: activations f32 -> Q8_1 planes, the input of the dp4a
// gemv and of mmq.
//
// Computes, for every 32-element block b of the row-major x[m][k] (k % 32 == 0):
//   amax = max |x_i|,  d = amax / 127 (IEEE f32 division),
//   q_i  = d == 0 ? 0 : roundf(x_i / d)   (IEEE division, round half away from 0),
//   s    = sum of the 32 q_i (an integer, exact in f32),
// and writes q[m][k] (int8, same indexing as x) and ds[m][k/32] = float2(d, s).
//
// Grid: 1-D, one thread per 4 consecutive elements (one float4 load, one
// 4-byte store); 8 consecutive threads form one block and reduce with shuffles.
// grid.x = ceil(m*k/4 / THREADS).
// Contract: bitexact against the CPU replay of exactly the rule above.
//
// Defines:
//   THREADS  threads per block, a multiple of 32, at most 1024

#ifndef THREADS
#error "quantize_q8_1.cu needs THREADS"
#endif

#include "common.cuh"

extern "C" __global__ void __launch_bounds__(THREADS)
quantize_q8_1(const float* __restrict__ x, i8* __restrict__ q, float2* __restrict__ ds, u64 n_elems) {
    const u64 t = (u64)blockIdx.x * THREADS + threadIdx.x;
    const u64 e = t * 4;
    // n_elems is a multiple of 32, so each aligned group of 8 lanes is
    // uniformly in or out of range and full-warp shuffles stay defined.
    const bool valid = e < n_elems;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (valid) v = *reinterpret_cast<const float4*>(x + e);
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = __fdiv_rn(amax, 127.0f);
    int q0 = 0, q1 = 0, q2 = 0, q3 = 0;
    if (d != 0.0f) {
        q0 = (int)roundf(__fdiv_rn(v.x, d));
        q1 = (int)roundf(__fdiv_rn(v.y, d));
        q2 = (int)roundf(__fdiv_rn(v.z, d));
        q3 = (int)roundf(__fdiv_rn(v.w, d));
    }
    int s = q0 + q1 + q2 + q3;
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (valid) {
        const u32 packed = (u32)(q0 & 0xff) | ((u32)(q1 & 0xff) << 8) | ((u32)(q2 & 0xff) << 16) | ((u32)(q3 & 0xff) << 24);
        *reinterpret_cast<u32*>(q + e) = packed;
        if ((threadIdx.x & 7) == 0) ds[e / 32] = make_float2(d, (float)s);
    }
}
