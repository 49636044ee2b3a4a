// act_convert.cu: f32 activations -> plain row-major 16-bit operands, the
// input of the vendor (cuBLAS bf16) GEMM arm of the engine.
//
// Computes out[i] = round_to_nearest_even(x[i]) in OUT (F16 or BF16) for
// i < n (n even): the same rounding as `quant::blocks::f32_to_f16` /
// `f32_to_bf16` on finite values.
//
// Grid: 1-D, one thread per 8 consecutive values (two float4 loads, one
// 16-byte store) while 8 remain, pairs for the tail; grid.x = ceil(n/8 /
// THREADS).
// x and out are 16-byte aligned (whole device buffers).
// Contract: bitexact against the CPU conversion of every finite value.
//
// Defines:
//   OUT      F16 | BF16
//   THREADS  threads per block, a multiple of 32, at most 1024

#ifndef OUT
#error "act_convert.cu needs OUT"
#endif
#ifndef THREADS
#error "act_convert.cu needs THREADS"
#endif

#include "common.cuh"

#define F16 1
#define BF16 2
#if OUT != F16 && OUT != BF16
#error "OUT must be F16 or BF16"
#endif

DEVI u32 pack2(float lo, float hi) {
#if OUT == F16
    return pack_f16x2(lo, hi);
#else
    return pack_bf16x2(lo, hi);
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS)
act_convert(const float* __restrict__ x, u32* __restrict__ out, u64 n) {
    pdl_enter();
    const u64 t = (u64)blockIdx.x * THREADS + threadIdx.x;
    const u64 e = t * 8;
    if (e + 8 <= n) {
        const float4 a = *reinterpret_cast<const float4*>(x + e);
        const float4 b = *reinterpret_cast<const float4*>(x + e + 4);
        uint4 o;
        o.x = pack2(a.x, a.y);
        o.y = pack2(a.z, a.w);
        o.z = pack2(b.x, b.y);
        o.w = pack2(b.z, b.w);
        *reinterpret_cast<uint4*>(out + e / 2) = o;
    } else {
        for (u64 i = e; i < n && i < e + 8; i += 2) out[i / 2] = pack2(x[i], x[i + 1]);
    }
}
