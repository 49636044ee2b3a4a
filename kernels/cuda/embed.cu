// embed.cu: the token embedding gather, out[r] = dequant(table[tokens[r]]) *
// scale, with the table in its GGUF type on the device (gather.cuh).
//
// ALGO=0: grid (ceil(width / THREADS), rows); one element per thread.
// ALGO=1: grid (1, ceil(rows / ROWS)); a block writes ROWS whole rows in
//   float4 stores, thread t taking the groups of four values t, t + THREADS,
//   ... (a warp's store is 512 contiguous bytes). Each pass loads the raw
//   words of ROWS * UNROLL groups before dequantizing and storing any, so a
//   thread has that many independent gathers in flight. Needs width % 4 == 0
//   and `out` and `table` 16-byte aligned (ld4_at in gather.cuh).
// Contract: bitexact against the CPU dequantization times the f32 scale
// (every value is dequant(q) * scale, two roundings, in that order).
//
// Defines:
//   WTYPE    Q8_0 | Q4_0 | Q6_K | F16 | BF16 | F32: the table's type
//   THREADS  threads per block, a multiple of 32, at most 1024
//   ALGO     0: one element per thread; 1: rows per block, float4 groups
//   UNROLL   groups of four values a thread loads per row per pass (ALGO=1)
//   ROWS     rows per block (ALGO=1)

#ifndef WTYPE
#error "embed.cu needs WTYPE"
#endif
#ifndef THREADS
#error "embed.cu needs THREADS"
#endif
#ifndef ALGO
#error "embed.cu needs ALGO"
#endif
#ifndef UNROLL
#error "embed.cu needs UNROLL"
#endif
#ifndef ROWS
#error "embed.cu needs ROWS"
#endif

#include "common.cuh"
#include "gather.cuh"

#if ALGO == 0

extern "C" __global__ void __launch_bounds__(THREADS)
embed(const int* __restrict__ tokens, const u8* __restrict__ table, float* __restrict__ out, int rows,
      int width, float scale) {
    const int r = blockIdx.y;
    const int c = blockIdx.x * THREADS + threadIdx.x;
    if (r >= rows || c >= width) return;
    const u8* row = table + (u64)tokens[r] * row_bytes(width);
    out[(u64)r * width + c] = deq_at(row, c) * scale;
}

#elif ALGO == 1

extern "C" __global__ void __launch_bounds__(THREADS)
embed(const int* __restrict__ tokens, const u8* __restrict__ table, float* __restrict__ out, int rows,
      int width, float scale) {
    const int groups = width / 4;
    const u64 rb = row_bytes(width);
    const int r0 = blockIdx.y * ROWS;
    // Rows and groups past the end load the last one again (a valid
    // address, no branch among the loads) and store nothing.
    const u8* src[ROWS];
#pragma unroll
    for (int k = 0; k < ROWS; ++k) src[k] = table + (u64)__ldg(tokens + min(r0 + k, rows - 1)) * rb;
    for (int g0 = threadIdx.x; g0 < groups; g0 += THREADS * UNROLL) {
        Raw4 raw[ROWS][UNROLL];
#pragma unroll
        for (int k = 0; k < ROWS; ++k) {
#pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                const int g = min(g0 + j * THREADS, groups - 1);
                raw[k][j] = ld4_at(src[k], 4 * g);
            }
        }
#pragma unroll
        for (int k = 0; k < ROWS; ++k) {
#pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                const int g = g0 + j * THREADS;
                if (g < groups && r0 + k < rows) {
                    const float4 a = deq4(raw[k][j], 4 * g);
                    reinterpret_cast<float4*>(out + (u64)(r0 + k) * width)[g] =
                        make_float4(a.x * scale, a.y * scale, a.z * scale, a.w * scale);
                }
            }
        }
    }
}

#else
#error "ALGO must be 0 or 1"
#endif
