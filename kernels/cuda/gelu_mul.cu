// gelu_mul.cu: out = gelu_tanh(g) * u, the gated activation of the FFN and
// of the PLE gate, written in the format the next GEMM reads.
//
// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in f32
// (common.cuh's, the one the fused GEMV uses).
// g and u are f32 with row strides (they may be the two halves of one fused
// gate|up output); out is [rows][width] in the OUT format (act_out.cuh).
//
// Grid: (ceil(width / 4 / THREADS), rows); thread t of block b handles the
// four values at column 4 (b THREADS + t).
// Contract: fp against the f64 oracle with OUT = F32 (f32 tanh); approx
// and tight against the CPU replay of the conversion with Q8_1 / DQ_*.
//
// Defines:
//   OUT      F32 | Q8_1 | DQ_F16 | DQ_BF16
//   THREADS  threads per block, a multiple of 32, at most 1024

#ifndef OUT
#error "gelu_mul.cu needs OUT"
#endif
#ifndef THREADS
#error "gelu_mul.cu needs THREADS"
#endif

#include "common.cuh"
#include "act_out.cuh"

extern "C" __global__ void __launch_bounds__(THREADS)
gelu_mul(const float* __restrict__ g, int g_stride, const float* __restrict__ u, int u_stride,
         void* __restrict__ out, float2* __restrict__ out_ds, int rows, int width) {
    pdl_enter();
    const int r = blockIdx.y;
    if (r >= rows) return;
    const int c4 = blockIdx.x * THREADS + threadIdx.x;
    const bool valid = c4 * 4 < width;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    if (valid) {
        const float4 gv = *reinterpret_cast<const float4*>(g + (u64)r * g_stride + (u64)c4 * 4);
        const float4 uv = *reinterpret_cast<const float4*>(u + (u64)r * u_stride + (u64)c4 * 4);
        o = make_float4(gelu_tanh(gv.x) * uv.x, gelu_tanh(gv.y) * uv.y, gelu_tanh(gv.z) * uv.z,
                        gelu_tanh(gv.w) * uv.w);
    }
    act_write4(out, out_ds, (u64)r * width + (u64)c4 * 4, o, valid);
}
