// embed.cu: the token embedding gather, out[r] = dequant(table[tokens[r]]) *
// scale, with the table in its GGUF type on the device (gather.cuh).
//
// Grid: (ceil(width / THREADS), rows); one element per thread.
// Contract: bitexact against the CPU dequantization times the f32 scale.
//
// Defines:
//   WTYPE    Q8_0 | Q4_0 | Q6_K | F16 | BF16 | F32: the table's type
//   THREADS  threads per block, a multiple of 32, at most 1024

#ifndef WTYPE
#error "embed.cu needs WTYPE"
#endif
#ifndef THREADS
#error "embed.cu needs THREADS"
#endif

#include "common.cuh"
#include "gather.cuh"

extern "C" __global__ void __launch_bounds__(THREADS)
embed(const int* __restrict__ tokens, const u8* __restrict__ table, float* __restrict__ out, int rows,
      int width, float scale) {
    const int r = blockIdx.y;
    const int c = blockIdx.x * THREADS + threadIdx.x;
    if (r >= rows || c >= width) return;
    const u8* row = table + (u64)tokens[r] * row_bytes(width);
    out[(u64)r * width + c] = deq_at(row, c) * scale;
}
