// softcap.cu: the final logit softcap, x = cap * tanh(x / cap), in place.
//
// Grid: (ceil(width / 4 / THREADS), rows); four values per thread.
// Contract: fp against the f64 oracle (f32 tanh).
//
// Defines:
//   THREADS  threads per block, a multiple of 32, at most 1024

#ifndef THREADS
#error "softcap.cu needs THREADS"
#endif

#include "common.cuh"

extern "C" __global__ void __launch_bounds__(THREADS)
softcap(float* __restrict__ x, int rows, int width, float cap) {
    pdl_enter();
    const int r = blockIdx.y;
    const int c4 = blockIdx.x * THREADS + threadIdx.x;
    if (r >= rows || c4 * 4 >= width) return;
    float4* p = reinterpret_cast<float4*>(x + (u64)r * width) + c4;
    float4 v = *p;
    const float inv = 1.0f / cap;
    v.x = cap * tanhf(v.x * inv);
    v.y = cap * tanhf(v.y * inv);
    v.z = cap * tanhf(v.z * inv);
    v.w = cap * tanhf(v.w * inv);
    *p = v;
}
