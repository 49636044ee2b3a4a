// dq_convert.cuh: the activation pre-pass shared by the f16/bf16 prefill
// GEMMs (gemm_dq.cu, gemm_wgmma.cu), and the operand-type ids they test.
//
// gemm_dq_convert converts x f32 -> DQ_TYPE, two values (one actual pair)
// per thread, into xh[m][k] with the k order both GEMMs' register dequant
// needs: inside every group of 16 k, actual pair q is stored at pair
// (q >> 1) + 4 * (q & 1), i.e. stored pair p holds actual pair
// [0,2,4,6,1,3,5,7][p]. n_pairs = m*k/2 with k a multiple of 16, so groups
// never straddle rows. The including file defines DQ_TYPE (F16 | BF16,
// checked below).
//
// Defines: (none of its own; uses the includer's DQ_TYPE)

#pragma once

// The ggml type ids (kquant.cuh and gather.cuh use the same values, so the
// GEMMs can compare WTYPE and DQ_TYPE against one set of names).
#define F16 1
#define BF16 30
#if DQ_TYPE != F16 && DQ_TYPE != BF16
#error "DQ_TYPE must be F16 or BF16"
#endif

extern "C" __global__ void __launch_bounds__(256) gemm_dq_convert(const float* __restrict__ x, u32* __restrict__ xh, u64 n_pairs) {
    pdl_enter();
    const u64 i = (u64)blockIdx.x * 256 + threadIdx.x;
    if (i >= n_pairs) return;
    const float2 v = reinterpret_cast<const float2*>(x)[i];
    const u32 q = (u32)i & 7u;
    const u64 o = (i & ~(u64)7) | ((q >> 1) + 4 * (q & 1));
#if DQ_TYPE == F16
    xh[o] = pack_f16x2(v.x, v.y);
#else
    xh[o] = pack_bf16x2(v.x, v.y);
#endif
}
