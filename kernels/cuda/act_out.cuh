// act_out.cuh: writing an activation row in the format the next GEMM reads,
// shared by the producers that fuse that conversion (rmsnorm, gelu_mul).
//
// OUT selects the format (passed as a bare token, e.g. -DOUT=Q8_1):
//   F32      f32, row-major;
//   Q8_1     int8 quants plus per-32 (d, sum) pairs: quantize_q8_1.cu's rule
//            (d = amax/127 with IEEE division, q = roundf(x/d));
//   Q8_SPLIT one 80-byte split record per 32 values (q8_split.cuh: two int8
//            planes, x ~ d1 q1 + d2 q2, about 15 bits), read by gemv ALGO 3;
//   DQ_F16   16-bit values, k order permuted inside every group of 16 as
//   DQ_BF16  dq_convert.cuh lays it out (actual pair q at stored pair
//            (q >> 1) + 4 * (q & 1)).
// `act_write4` stores four consecutive values starting at flat element e
// (e % 4 == 0) in OUT; `act_write4_as<FMT>` in format FMT (a kernel with an
// output of its own in OUT and a second one in another format). For Q8_1 and Q8_SPLIT the 8 lanes e..e+31 of one 32-block
// must call it together (lanes of an aligned group of 8 in one warp, all 32
// lanes of the warp calling it uniformly; `valid` = false lanes pass zeros
// and store nothing).
//
// Defines: (none of its own; uses the includer's OUT)

#pragma once

#define F32 101
#define Q8_1 102
#define DQ_F16 103
#define DQ_BF16 104
#define Q8_SPLIT 105
#if OUT != F32 && OUT != Q8_1 && OUT != DQ_F16 && OUT != DQ_BF16 && OUT != Q8_SPLIT
#error "OUT must be F32, Q8_1, DQ_F16, DQ_BF16 or Q8_SPLIT"
#endif

#include "q8_split.cuh"

template <int FMT>
DEVI void act_write4_as(void* out, float2* out_ds, u64 e, float4 v, bool valid) {
    if constexpr (FMT == F32) {
        (void)out_ds;
        if (valid) *reinterpret_cast<float4*>(reinterpret_cast<float*>(out) + e) = v;
    } else if constexpr (FMT == Q8_1) {
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
            const u32 packed =
                (u32)(q0 & 0xff) | ((u32)(q1 & 0xff) << 8) | ((u32)(q2 & 0xff) << 16) | ((u32)(q3 & 0xff) << 24);
            *reinterpret_cast<u32*>(reinterpret_cast<i8*>(out) + e) = packed;
            if ((e & 31) == 0) out_ds[e / 32] = make_float2(d, (float)s);
        }
    } else if constexpr (FMT == Q8_SPLIT) {
        (void)out_ds;
        split_write4(reinterpret_cast<XSplit*>(out) + e / 32, (int)(e & 31), v, valid);
    } else {
        static_assert(FMT == DQ_F16 || FMT == DQ_BF16, "act_write4_as: unknown format");
        (void)out_ds;
        if (valid) {
            u32* w = reinterpret_cast<u32*>(out) + (e & ~(u64)15) / 2;
            const u32 q0 = (u32)(e & 15) / 2;  // actual pair of (v.x, v.y): 0, 2, 4 or 6
            if constexpr (FMT == DQ_F16) {
                w[q0 / 2] = pack_f16x2(v.x, v.y);
                w[q0 / 2 + 4] = pack_f16x2(v.z, v.w);
            } else {
                w[q0 / 2] = pack_bf16x2(v.x, v.y);
                w[q0 / 2 + 4] = pack_bf16x2(v.z, v.w);
            }
        }
    }
}

// The includer's own output format (OUT).
DEVI void act_write4(void* out, float2* out_ds, u64 e, float4 v, bool valid) {
    act_write4_as<OUT>(out, out_ds, e, v, valid);
}

// Block-wide sum of one value per thread (THREADS threads, a multiple of
// 32); every thread gets the total. `red` holds THREADS / 32 floats.
DEVI float block_sum(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) t += red[i];
    return t;
}
