// quantize_q8_1.cu: activations f32 -> the integer formats of the dp4a
// GEMVs and of mmq: Q8_1 planes, or split Q8 records (the engine's pre-pass
// where no producer writes the format itself).
//
// OUT=Q8_1: for every 32-element block b of the row-major x[m][k]
// (k % 32 == 0):
//   amax = max |x_i|,  d = amax / 127 (IEEE f32 division),
//   q_i  = d == 0 ? 0 : roundf(x_i / d)   (IEEE division, round half away from 0),
//   s    = sum of the 32 q_i (an integer, exact in f32),
// and writes q[m][k] (int8, same indexing as x) and ds[m][k/32] = float2(d, s).
// OUT=Q8_SPLIT: for every block, the 80-byte split record of q8_split.cuh
// (x ~ d1 q1 + d2 q2) at ((XSplit*)q)[b]; ds is not written (may be null).
// Both rules are act_out.cuh's, shared with the producers that fuse them.
//
// Grid: 1-D, one thread per 4 consecutive elements (one float4 load);
// 8 consecutive threads form one block and reduce with shuffles.
// grid.x = ceil(m*k/4 / THREADS).
// Contract: bitexact against the CPU replay of exactly the rule of OUT
// (families::q8_1_replay, families::q8_split_records).
//
// Defines:
//   THREADS  threads per block, a multiple of 32, at most 1024
//   OUT      Q8_1 | Q8_SPLIT

#ifndef THREADS
#error "quantize_q8_1.cu needs THREADS"
#endif
#ifndef OUT
#error "quantize_q8_1.cu needs OUT"
#endif

#include "common.cuh"
#include "act_out.cuh"

#if OUT != Q8_1 && OUT != Q8_SPLIT
#error "quantize_q8_1.cu writes OUT=Q8_1 or OUT=Q8_SPLIT"
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
quantize_q8_1(const float* __restrict__ x, i8* __restrict__ q, float2* __restrict__ ds, u64 n_elems) {
    pdl_enter();
    const u64 t = (u64)blockIdx.x * THREADS + threadIdx.x;
    const u64 e = t * 4;
    // n_elems is a multiple of 32, so each aligned group of 8 lanes is
    // uniformly in or out of range and full-warp shuffles stay defined.
    const bool valid = e < n_elems;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (valid) v = *reinterpret_cast<const float4*>(x + e);
    act_write4(q, ds, e, v, valid);
}
