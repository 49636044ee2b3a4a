// gemv.cu: decode matmul for 1..8 tokens with Q8_0 / Q4_0 weights.
//
// Computes y[t][r] = sum_k x[t][k] * W[r][k] for t < NT (NT = 1..8, one entry
// per count: gemv_n1 .. gemv_n8), r < n, with W dequantized as d * q. With
// FUSE=1 there are two matrices (gate G, up U) and y[t][r] = gelu_tanh(G x)
// * (U x) (the Gemma FFN input half).
//
// Weights, per LAYOUT:
//   0: GGUF blocks, row-major [n][k/32] blocks of 34 (Q8_0) / 18 (Q4_0) bytes,
//      read with 2-byte loads (the blocks are only 2-byte aligned); wd unused.
//   1: planes repacked on the host: quants wq[n][k] (Q8_0, int8) or
//      wq[n][k/2] (Q4_0, each 16-byte group = one block in GGUF nibble order:
//      byte j holds element j in the low and j+16 in the high nibble), and
//      f16 scales wd[n][k/32]; quants are read with 16-byte loads.
// Activations, per ALGO:
//   0: f32 x[NT][k]; weights dequantized and multiplied with fp32 FMA.
//   1: Q8_1 planes from quantize_q8_1: xq[NT][k] int8 and xds[NT][k/32] =
//      (d, sum of q); 4-way int8 dot products with dp4a, one scale multiply
//      per (half-)block.
// Output y[NT][n] f32, every element written exactly once.
//
// Grid: 1-D, grid.x = ceil(n / ((WARPS/KSPLIT)*ROWS)), block = WARPS*32
// threads. The warps form WARPS/KSPLIT row groups of KSPLIT warps; a group
// owns ROWS consecutive rows and its warps split k: warp s of the group
// walks 16-byte chunks (LAYOUT 1, Q8_0: 16 elements; otherwise one
// 32-element block) s*32+lane, stepping 32*KSPLIT, UNROLL chunks' loads
// issued before their math. Shuffles reduce each warp; with KSPLIT > 1 the
// group's partial sums meet in shared memory.
// Contract: ALGO 0: fp (reassociated f32 sums of exactly dequantized
// weights). ALGO 1: approx against the f64 oracle (Q8_1 activation noise) and
// tight against the CPU replay of the Q8_1 activations.
//
// Defines:
//   WTYPE   weight type: Q8_0 | Q4_0
//   ALGO    0 = dequant + fp32 FMA on f32 activations, 1 = dp4a on Q8_1 activations
//   LAYOUT  0 = GGUF blocks (2-byte loads), 1 = aligned planes (16-byte loads)
//   ROWS    rows per warp (1..8)
//   WARPS   warps per block (1..32)
//   FUSE    0 = plain, 1 = gate+up with gelu_tanh(gate) * up
//   KSPLIT  warps sharing one row group (split over k): 1, 2, 4, 8; divides WARPS
//   UNROLL  chunks per lane whose loads are in flight together: 1, 2, 4

#ifndef WTYPE
#error "gemv.cu needs WTYPE"
#endif
#ifndef ALGO
#error "gemv.cu needs ALGO"
#endif
#ifndef LAYOUT
#error "gemv.cu needs LAYOUT"
#endif
#ifndef ROWS
#error "gemv.cu needs ROWS"
#endif
#ifndef WARPS
#error "gemv.cu needs WARPS"
#endif
#ifndef FUSE
#error "gemv.cu needs FUSE"
#endif
#ifndef KSPLIT
#error "gemv.cu needs KSPLIT"
#endif
#ifndef UNROLL
#error "gemv.cu needs UNROLL"
#endif
#if WARPS % KSPLIT != 0
#error "KSPLIT must divide WARPS"
#endif

#include "common.cuh"

#if WTYPE != Q8_0 && WTYPE != Q4_0
#error "WTYPE must be Q8_0 or Q4_0"
#endif

#define NMAT (FUSE ? 2 : 1)
// Elements per chunk and 32-bit quant words per chunk.
#if LAYOUT == 1 && WTYPE == Q8_0
#define CHUNK 16
#define CWORDS 4
#elif WTYPE == Q8_0
#define CHUNK 32
#define CWORDS 8
#else
#define CHUNK 32
#define CWORDS 4
#endif

struct Chunk {
    u32 w[CWORDS];
    float d;
};

// Loads chunk c (elements c*CHUNK ..) of row `row`.
DEVI Chunk load_chunk(const u8* __restrict__ wq, const u16* __restrict__ wd, int row, int c, int k) {
    Chunk ch;
    const int nb = k / 32;
    const int b = (c * CHUNK) / 32;
#if LAYOUT == 1
#if WTYPE == Q8_0
    const uint4 v = ld_stream16(wq + (u64)row * k + (u64)c * 16);
#else
    const uint4 v = ld_stream16(wq + (u64)row * (k / 2) + (u64)c * 16);
#endif
    ch.w[0] = v.x; ch.w[1] = v.y; ch.w[2] = v.z; ch.w[3] = v.w;
    ch.d = h2f(__ldg(wd + (u64)row * nb + b));
#else
    const int bsz = WTYPE == Q8_0 ? 34 : 18;
    const u16* bp = reinterpret_cast<const u16*>(wq + ((u64)row * nb + b) * bsz);
    ch.d = h2f(__ldg(bp));
#pragma unroll
    for (int i = 0; i < CWORDS; ++i) ch.w[i] = (u32)__ldg(bp + 1 + 2 * i) | ((u32)__ldg(bp + 2 + 2 * i) << 16);
#endif
    return ch;
}

#if ALGO == 0
// sum_i w_i * x_i over the chunk, x at element offset e of one token row.
DEVI float chunk_dot(const Chunk& ch, const float* __restrict__ xr, int e) {
    float s = 0.f;
#if WTYPE == Q8_0
#pragma unroll
    for (int i = 0; i < CWORDS; ++i) {
        const float4 xv = __ldg(reinterpret_cast<const float4*>(xr + e + 4 * i));
        const u32 w = ch.w[i];
        s = fmaf((float)(i8)(w & 0xff), xv.x, s);
        s = fmaf((float)(i8)((w >> 8) & 0xff), xv.y, s);
        s = fmaf((float)(i8)((w >> 16) & 0xff), xv.z, s);
        s = fmaf((float)(i8)(w >> 24), xv.w, s);
    }
#else
#pragma unroll
    for (int i = 0; i < CWORDS; ++i) {
        const float4 xl = __ldg(reinterpret_cast<const float4*>(xr + e + 4 * i));
        const float4 xh = __ldg(reinterpret_cast<const float4*>(xr + e + 16 + 4 * i));
        const u32 w = ch.w[i];
        s = fmaf((float)((int)(w & 0xf) - 8), xl.x, s);
        s = fmaf((float)((int)((w >> 8) & 0xf) - 8), xl.y, s);
        s = fmaf((float)((int)((w >> 16) & 0xf) - 8), xl.z, s);
        s = fmaf((float)((int)((w >> 24) & 0xf) - 8), xl.w, s);
        s = fmaf((float)((int)((w >> 4) & 0xf) - 8), xh.x, s);
        s = fmaf((float)((int)((w >> 12) & 0xf) - 8), xh.y, s);
        s = fmaf((float)((int)((w >> 20) & 0xf) - 8), xh.z, s);
        s = fmaf((float)((int)((w >> 28) & 0xf) - 8), xh.w, s);
    }
#endif
    return ch.d * s;
}
#else
// Integer dot of the chunk with the Q8_1 activations of one token, scaled.
DEVI float chunk_dot_q8(const Chunk& ch, const i8* __restrict__ xqr, const float2* __restrict__ xdsr, int e) {
    const float2 ds = __ldg(xdsr + e / 32);
    int dot = 0;
#if WTYPE == Q8_0
#pragma unroll
    for (int i = 0; i < CWORDS; i += 4) {
        const int4 a = __ldg(reinterpret_cast<const int4*>(xqr + e + 4 * i));
        dot = dp4a((int)ch.w[i + 0], a.x, dot);
        dot = dp4a((int)ch.w[i + 1], a.y, dot);
        dot = dp4a((int)ch.w[i + 2], a.z, dot);
        dot = dp4a((int)ch.w[i + 3], a.w, dot);
    }
#else
    const int4 al = __ldg(reinterpret_cast<const int4*>(xqr + e));
    const int4 ah = __ldg(reinterpret_cast<const int4*>(xqr + e + 16));
    dot = dp4a((int)(ch.w[0] & 0x0F0F0F0Fu), al.x, dot);
    dot = dp4a((int)(ch.w[1] & 0x0F0F0F0Fu), al.y, dot);
    dot = dp4a((int)(ch.w[2] & 0x0F0F0F0Fu), al.z, dot);
    dot = dp4a((int)(ch.w[3] & 0x0F0F0F0Fu), al.w, dot);
    dot = dp4a((int)((ch.w[0] >> 4) & 0x0F0F0F0Fu), ah.x, dot);
    dot = dp4a((int)((ch.w[1] >> 4) & 0x0F0F0F0Fu), ah.y, dot);
    dot = dp4a((int)((ch.w[2] >> 4) & 0x0F0F0F0Fu), ah.z, dot);
    dot = dp4a((int)((ch.w[3] >> 4) & 0x0F0F0F0Fu), ah.w, dot);
    // sum_j (q_j - 8) a_j = sum_j q_j a_j - 8 sum_j a_j; ds.y is the exact sum.
    dot -= 8 * (int)ds.y;
#endif
    return (float)dot * (ch.d * ds.x);
}
#endif

template <int NT>
DEVI void gemv_body(const u8* __restrict__ wq, const u16* __restrict__ wd,
                    const u8* __restrict__ wq2, const u16* __restrict__ wd2,
                    const float* __restrict__ x, const i8* __restrict__ xq, const float2* __restrict__ xds,
                    float* __restrict__ y, int n, int k) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = warp / KSPLIT, slice = warp % KSPLIT;
    const int row0 = (blockIdx.x * (WARPS / KSPLIT) + group) * ROWS;
    // Groups past the end still reach the barrier below (KSPLIT > 1).
    const bool active = row0 < n;
    float acc[NMAT][ROWS][NT];
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[m][r][t] = 0.f;
    const int nchunks = active ? k / CHUNK : 0;
    const int step = 32 * KSPLIT;
    for (int c0 = slice * 32 + lane; c0 < nchunks; c0 += step * UNROLL) {
        Chunk ch[UNROLL][NMAT][ROWS];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            // Chunks past the end re-read chunk c0; their math is skipped.
            const int c = c0 + u * step < nchunks ? c0 + u * step : c0;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                // Rows past the end re-read the last row; their sums are dropped.
                const int row = min(row0 + r, n - 1);
                ch[u][0][r] = load_chunk(wq, wd, row, c, k);
#if FUSE
                ch[u][1][r] = load_chunk(wq2, wd2, row, c, k);
#endif
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int c = c0 + u * step;
            if (c < nchunks) {
                const int e = c * CHUNK;
#pragma unroll
                for (int t = 0; t < NT; ++t) {
#pragma unroll
                    for (int m = 0; m < NMAT; ++m)
#pragma unroll
                        for (int r = 0; r < ROWS; ++r) {
#if ALGO == 0
                            acc[m][r][t] += chunk_dot(ch[u][m][r], x + (u64)t * k, e);
#else
                            acc[m][r][t] += chunk_dot_q8(ch[u][m][r], xq + (u64)t * k, xds + (u64)t * (k / 32), e);
#endif
                        }
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[m][r][t] = warp_sum(acc[m][r][t]);
#if KSPLIT > 1
    __shared__ float red[WARPS][NMAT * ROWS * NT];
    if (lane == 0) {
#pragma unroll
        for (int m = 0; m < NMAT; ++m)
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
#pragma unroll
                for (int t = 0; t < NT; ++t) red[warp][(m * ROWS + r) * NT + t] = acc[m][r][t];
    }
    __syncthreads();
    if (slice != 0) return;
    if (lane == 0) {
#pragma unroll
        for (int s = 1; s < KSPLIT; ++s)
#pragma unroll
            for (int m = 0; m < NMAT; ++m)
#pragma unroll
                for (int r = 0; r < ROWS; ++r)
#pragma unroll
                    for (int t = 0; t < NT; ++t) acc[m][r][t] += red[warp + s][(m * ROWS + r) * NT + t];
    }
#endif
    if (lane == 0 && active) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (row0 + r < n) {
#pragma unroll
                for (int t = 0; t < NT; ++t) {
#if FUSE
                    y[(u64)t * n + row0 + r] = gelu_tanh(acc[0][r][t]) * acc[1][r][t];
#else
                    y[(u64)t * n + row0 + r] = acc[0][r][t];
#endif
                }
            }
        }
    }
}

#define GEMV_ENTRY(NT)                                                                          \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, 1) gemv_n##NT(                     \
        const u8* wq, const u16* wd, const u8* wq2, const u16* wd2, const float* x,            \
        const i8* xq, const float2* xds, float* y, int n, int k) {                              \
        gemv_body<NT>(wq, wd, wq2, wd2, x, xq, xds, y, n, k);                                   \
    }
GEMV_ENTRY(1)
GEMV_ENTRY(2)
GEMV_ENTRY(3)
GEMV_ENTRY(4)
GEMV_ENTRY(5)
GEMV_ENTRY(6)
GEMV_ENTRY(7)
GEMV_ENTRY(8)
