// ple.cu: the per-layer inputs of Gemma 4's E2B/E4B models, for one call's
// tokens. With P the chunk width and L the layer count, for row r and chunk l:
//   p   = proj[r][l*P .. (l+1)*P] * proj_scale           (proj_scale = 1/sqrt(d))
//   out[r][l*P + i] = (rmsnorm(p)[i] * proj_norm[i]
//                      + dequant(table[tokens[r]])[l*P + i] * tok_scale)  (tok_scale = sqrt(P))
//                     * 1/sqrt(2)
// proj is the per_layer_model_proj GEMM output (f32 [rows][L*P]); the PLE
// table stays on the device in its GGUF type (gather.cuh).
//
// Grid: (L, rows); THREADS threads stride over the chunk's P values (P <=
// 4 * THREADS), the chunk's sum of squares is a block reduction.
// Contract: fp against the f64 oracle.
//
// Defines:
//   WTYPE    Q8_0 | Q4_0 | Q6_K | F16 | BF16 | F32: the table's type
//   THREADS  threads per block, a multiple of 32, at most 1024

#ifndef WTYPE
#error "ple.cu needs WTYPE"
#endif
#ifndef THREADS
#error "ple.cu needs THREADS"
#endif

#include "common.cuh"
#include "gather.cuh"

extern "C" __global__ void __launch_bounds__(THREADS)
ple(const int* __restrict__ tokens, const u8* __restrict__ table, const float* __restrict__ proj,
    const float* __restrict__ proj_norm, float* __restrict__ out, int rows, int n_layers, int ple_dim,
    float proj_scale, float tok_scale, float eps) {
    pdl_enter();
    __shared__ float red[THREADS / 32];
    const int l = blockIdx.x, r = blockIdx.y;
    if (r >= rows || l >= n_layers) return;
    const int lp = n_layers * ple_dim;
    const u64 base = (u64)r * lp + (u64)l * ple_dim;
    float v[4];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int i = j * THREADS + threadIdx.x;
        v[j] = i < ple_dim ? proj[base + i] * proj_scale : 0.0f;
        ss += v[j] * v[j];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < THREADS / 32; ++w) tot += red[w];
    const float rs = rsqrtf(tot / (float)ple_dim + eps);
    const u8* row = table + (u64)tokens[r] * row_bytes(lp);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int i = j * THREADS + threadIdx.x;
        if (i < ple_dim) {
            const float e = deq_at(row, l * ple_dim + i) * tok_scale;
            out[base + i] = (v[j] * rs * proj_norm[i] + e) * 0.70710678118654752f;
        }
    }
}
