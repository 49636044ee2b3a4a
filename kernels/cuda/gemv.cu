// gemv.cu: decode matmul for 1..8 tokens with Q8_0 / Q4_0 / Q4_K / Q5_K /
// Q6_K / F16 / BF16 weights.
//
// Computes y[t][r] = sum_k x[t][k] * W[r][k] for t < NT (NT = 1..8, one entry
// per count: gemv_n1 .. gemv_n8), r < n, with W dequantized as ggml does:
// d * q (Q8_0, Q4_0 with q - 8), (d * sc) * q - dmin * m (Q4_K, Q5_K),
// (d * scale) * (q - 32) (Q6_K), the value itself (F16, BF16). With FUSE=1
// there are two matrices (gate G, up U) and y[t][r] = gelu_tanh(G x) * (U x)
// (the Gemma FFN input half); with FUSE=2 one matrix and a given f32 operand
// s, y[t][r] = gelu_tanh(W x)[t][r] * side[t * side_stride + r] (the PLE
// gate of E2B/E4B times the layer's per-layer input, so no gelu_mul launch
// stands between the PLE's two GEMVs).
//
// Weights, per LAYOUT:
//   0: GGUF blocks, row-major [n][k/32] blocks of 34 (Q8_0) / 18 (Q4_0) bytes,
//      read with 2-byte loads (the blocks are only 2-byte aligned); wd unused.
//      Q6_K (the tied LM head as Gemma 4 Q4_0 files store it): row-major
//      [n][k/256] super-blocks of 210 bytes (ql[128] low nibbles, qh[64]
//      2-bit high parts, scales[16] int8, d f16), read as they are in the
//      file; ALGO 0 and FUSE 0 only. A 32-element chunk j of a
//      super-block (half h = j/4, quarter u = j%4) is 32 contiguous ql bytes
//      at 64h + 32(u&1) (nibble u/2), 32 contiguous qh bytes at 128 + 32h
//      (bits 2u..2u+1) and the two scales at 192 + 2j: each 32-byte run is
//      9 aligned 4-byte loads and funnel shifts (super-blocks sit at 2 mod 4
//      every other one), so `wq` must be 4-byte aligned (device allocations
//      are). The words reach at most 2 bytes before a run (inside the
//      buffer) and 4 bytes past it (inside the super-block).
//   1: planes repacked on the host: quants wq[n][k] (Q8_0, int8) or
//      wq[n][k/2] (Q4_0, each 16-byte group = one block in GGUF nibble order:
//      byte j holds element j in the low and j+16 in the high nibble), and
//      f16 scales wd[n][k/32]; quants are read with 16-byte loads.
//      The k-quants (kquant.cuh, kernels/src/quant/repack.rs): wq is the
//      nibble plane [n][k/2] (Q4_0's order per 32-element group) and wd the
//      GEMV side records [n][k/256] (Q4_K 16, Q5_K 48, Q6_K 88 bytes: d,
//      dmin and the packed 6-bit scales and mins, or the i8 scales and d,
//      and the high-bit words); a lane's chunk is one group: a 16-byte
//      nibble load plus the record's header (the 8 lanes of a super-block
//      read the same bytes in one request) and its high-bit word(s).
//   F16 / BF16 (LAYOUT 0 or 1, the same bytes): wq[n][k] as stored, wd
//      unused, 16-byte loads of 8 values; k must be a multiple of 8.
// Activations, per ALGO:
//   0: f32 x[NT][k]; weights dequantized exactly (the f32 value ggml's
//      dequantization gives) and multiplied with fp32 FMA.
//   1: Q8_1 planes from quantize_q8_1: xq[NT][k] int8 and xds[NT][k/32] =
//      (d, sum of q); 4-way int8 dot products with dp4a, one scale multiply
//      per (half-)block; the k-quants' mins fold in through the Q8_1 sums
//      (d_x * (d*sc * dot - dmin*m * sum)). Not for F16 / BF16 or Q6_K on
//      GGUF blocks.
//   2: split Q8 activations, k-quant planes only (Q4_K, Q5_K, Q6_K,
//      LAYOUT 1): each block reads the f32 rows x[NT][k] and writes, per
//      32-element group, x ~ d1 * q1 + d2 * q2 into shared memory (q1 the
//      Q8_1 quantization of x, q2 that of its residual x - d1 * q1, each
//      with its own scale over 127 and integer sum: an 80-byte record per
//      group and token), then takes two dp4a dot products per word. The
//      residual's scale is under 1/254 of the first, so the activations
//      carry about 15 bits instead of Q8_1's 8, while the weights keep
//      dp4a's integer path (the FMA path dequantizes every weight to f32
//      and is bound by that arithmetic at 4-6 bits per weight).
//   3: the same split Q8 activations and dot products as ALGO 2, read as
//      records that a producer wrote once per step (act_out.cuh or the
//      quantize_q8_1 pre-pass with OUT=Q8_SPLIT): xq is XSplit[NT][k/32]
//      (q8_split.cuh), xds unused. No per-block split, no shared memory: a
//      lane reads its group's 80-byte record with five 16-byte loads (three
//      for a Q8_0 chunk, which is half a group). Planes of the k-quants and
//      of Q8_0 and Q4_0 (LAYOUT 1): for Q8_0 this keeps dp4a's integer
//      path at about 15-bit activations where ALGO 1's Q8_1 carries 8.
//   XSMEM=1 (ALGO 0): each block first copies the f32 rows x[NT][k] into
//      shared memory, 4 floats of padding after every 32-element group
//      (NT * k * 4.5 bytes of dynamic shared memory), and the chunks read
//      them there. A lane owns whole 32-element groups, so in global memory
//      the lanes of a warp read 16-byte pieces 128 bytes apart: 32 cache
//      lines per warp-wide load, which binds the FMA path well before HBM
//      does. In padded shared memory the same reads are conflict-free. The
//      price is the copy: k * 4 * NT bytes from L2 per block.
// Output, per OUT: F32: y[NT][n] f32, every element written exactly once;
// Q8_SPLIT: the same values (gelu(G x) * (U x) with FUSE=1, gelu(W x) * s
// with FUSE=2) as split Q8
// records XSplit[NT][n / 32] (q8_split.cuh), the input the next GEMV reads
// with ALGO 3, so no producer pass stands between the two GEMVs (the FFN's
// gate|up and down). n must be a multiple of 32 and a block's rows,
// (WARPS / KSPLIT) * ROWS, a multiple of 32: the block owns whole records.
//
// Tail, per TAIL (OUT=F32, FUSE=0 only): 1 runs the layer's sandwich-norm
// step over y in the grid's last block (sandwich_tail.cuh): the residual
// h_out = (h_in + rmsnorm(y) * w_add) * s (s = *scale, NULL: 1) and, unless
// TAIL_OUT is NONE, the next projection's input rmsnorm(h_out) * w_out in
// format TAIL_OUT (tout, tout_ds). `scratch`: its first u32 is 0 at the
// launch and is left 0, and from float TAIL_PARTIALS on each block writes
// its outputs' sum of squares per token ([grid][NT] floats). The blocks
// count themselves in on the u32; the last one sums the partials in block
// order and reads y back through L2. A decode projection then needs no
// norm launch after it: one block does in the tail what the norm launch's
// one block per row did, without the launch and the grid boundary.
//
// Grid: 1-D, grid.x = ceil(n / ((WARPS/KSPLIT)*ROWS)), block = WARPS*32
// threads. The warps form WARPS/KSPLIT row groups of KSPLIT warps; a group
// owns ROWS consecutive rows and its warps split k: warp s of the group
// walks 16-byte chunks (LAYOUT 1, Q8_0: 16 elements; F16/BF16: 8 elements;
// otherwise one 32-element block or group, or 32 elements of a Q6_K
// super-block) s*32+lane, stepping 32*KSPLIT, UNROLL chunks' loads issued
// before their math.
// Shuffles reduce each warp; with KSPLIT > 1 the group's partial sums meet
// in shared memory.
// Contract: ALGO 0: fp (reassociated f32 sums of exactly dequantized
// weights; Q6_K's d * scale and (q - 32) are exact in f32, and on GGUF
// blocks the kernel sums x * (q - 32) per 16-element scale group before the
// d * scale multiply). ALGO 1: approx against the f64 oracle (Q8_1
// activation noise) and tight against the CPU replay of the Q8_1
// activations. ALGO 2: approx with a tolerance two orders below ALGO 1's
// (the split's residual noise, about 1e-5 of the activations' RMS), and
// tight against the CPU replay of the split. ALGO 3: as ALGO 2 (the same
// records, made by the producer). OUT=Q8_SPLIT adds the output split's
// rounding (about 1e-5 of the outputs' RMS) to each contract's bound, and
// the replay comparison splits the replayed outputs by the same rule.
// TAIL=1 adds the step's outputs to the comparison: fp in f32 (the step's
// own sums), with TAIL_OUT = Q8_1 or Q8_SPLIT that format's rounding.
//
// Defines:
//   WTYPE   weight type: Q8_0 | Q4_0 | Q4_K | Q5_K | Q6_K | F16 | BF16
//   ALGO    0 = dequant + fp32 FMA on f32 activations, 1 = dp4a on Q8_1
//           activations, 2 = dp4a on split Q8 activations made per block,
//           3 = dp4a on split Q8 records written by the producer
//   LAYOUT  0 = GGUF blocks (2-byte loads), 1 = aligned planes (16-byte loads)
//   ROWS    rows per warp (1..8)
//   WARPS   warps per block (1..32)
//   FUSE    0 = plain, 1 = gate+up with gelu_tanh(gate) * up, 2 = gelu_tanh(W x)
//           times the side operand (side, side_stride; unused otherwise)
//   KSPLIT  warps sharing one row group (split over k): 1, 2, 4, 8; divides WARPS
//   UNROLL  chunks per lane whose loads are in flight together: 1, 2, 4
//   XSMEM   0 = activations read from global memory, 1 = staged in shared
//           memory first (ALGO 0 only; k a multiple of 32)
//   OUT     F32 | Q8_SPLIT: the output's format
//   TAIL    0 | 1: the sandwich-norm step in the last block (OUT=F32, FUSE=0)
//   TAIL_OUT NONE | F32 | Q8_1 | Q8_SPLIT: the tail's normalized output
//   PRELOAD 0 = each lane loads its chunks after the launch's wait (pdl_enter),
//           1 = its first UNROLL chunks before it (the loop over the rest
//           and the order of the sums unchanged): a chained launch's weight
//           stream then starts while the grid ahead finishes; 2 = as 1,
//           and the quant bytes of its next two rounds of chunks prefetched
//           into L2 before the wait as well (planes and 16-bit rows)

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
#ifndef XSMEM
#error "gemv.cu needs XSMEM"
#endif
#ifndef OUT
#error "gemv.cu needs OUT"
#endif
#ifndef TAIL
#error "gemv.cu needs TAIL"
#endif
#ifndef TAIL_OUT
#error "gemv.cu needs TAIL_OUT"
#endif
#ifndef PRELOAD
#error "gemv.cu needs PRELOAD"
#endif
#if PRELOAD < 0 || PRELOAD > 2
#error "gemv.cu: PRELOAD must be 0, 1 or 2"
#endif
#if XSMEM && ALGO != 0
#error "XSMEM=1 stages f32 activations: it needs ALGO=0"
#endif
#if ALGO < 0 || ALGO > 3
#error "ALGO must be 0, 1, 2 or 3"
#endif
#if WARPS % KSPLIT != 0
#error "KSPLIT must divide WARPS"
#endif

#include "common.cuh"
#include "kquant.cuh"
#include "act_out.cuh"
#include "sandwich_tail.cuh"

// Rows one block owns: WARPS / KSPLIT row groups of ROWS rows.
#define BLOCK_ROWS ((WARPS / KSPLIT) * ROWS)
#if OUT != F32 && OUT != Q8_SPLIT
#error "gemv.cu: OUT must be F32 or Q8_SPLIT"
#endif
#if TAIL != 0 && TAIL != 1
#error "gemv.cu: TAIL must be 0 or 1"
#endif
#if TAIL && (OUT != F32 || FUSE != 0)
#error "TAIL=1 reads y back as f32 rows of the plain product: it needs OUT=F32 and FUSE=0"
#endif
#if TAIL_OUT != NONE && TAIL_OUT != F32 && TAIL_OUT != Q8_1 && TAIL_OUT != Q8_SPLIT
#error "gemv.cu: TAIL_OUT must be NONE, F32, Q8_1 or Q8_SPLIT"
#endif
#if OUT == Q8_SPLIT && BLOCK_ROWS % 32 != 0
#error "OUT=Q8_SPLIT needs (WARPS / KSPLIT) * ROWS a multiple of 32: a block writes whole 32-row records"
#endif

#if WTYPE != Q8_0 && WTYPE != Q4_0 && !IS_KQUANT(WTYPE) && !IS_W16(WTYPE)
#error "WTYPE must be Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, F16 or BF16"
#endif
#if WTYPE == Q6_K && LAYOUT == 0 && (ALGO != 0 || FUSE != 0)
#error "Q6_K GGUF super-blocks (LAYOUT=0) need ALGO=0 and FUSE=0"
#endif
#if (WTYPE == Q4_K || WTYPE == Q5_K) && LAYOUT != 1
#error "Q4_K / Q5_K weights are read as planes (LAYOUT=1)"
#endif
#if IS_W16(WTYPE) && ALGO != 0
#error "F16 / BF16 weights need ALGO=0"
#endif
#if ALGO == 2 && !(IS_KQUANT(WTYPE) && LAYOUT == 1)
#error "ALGO=2 (split Q8 activations made per block) reads k-quant planes (Q4_K, Q5_K, Q6_K with LAYOUT=1)"
#endif
#if ALGO == 3 && !((IS_KQUANT(WTYPE) || WTYPE == Q8_0 || WTYPE == Q4_0) && LAYOUT == 1)
#error "ALGO=3 (split Q8 records) reads planes (LAYOUT=1) of Q8_0, Q4_0, Q4_K, Q5_K or Q6_K"
#endif

#if XSMEM
#define GEMV_XPAD
#endif
#include "gemv_chunk.cuh"

#if FUSE != 0 && FUSE != 1 && FUSE != 2
#error "gemv.cu: FUSE must be 0, 1 or 2"
#endif
#define NMAT (FUSE == 1 ? 2 : 1)

// The value written for output row `row` (< n) of token t from its sums:
// g (the matrix's, or the gate's) and u (the up matrix's, FUSE=1 only).
DEVI float gemv_value(float g, float u, const float* __restrict__ side, int side_stride, int t, int row) {
#if FUSE == 1
    (void)side, (void)side_stride, (void)t, (void)row;
    return gelu_tanh(g) * u;
#elif FUSE == 2
    (void)u;
    return gelu_tanh(g) * __ldg(side + (u64)t * side_stride + row);
#else
    (void)u, (void)side, (void)side_stride, (void)t, (void)row;
    return g;
#endif
}

#if ALGO == 0 && KQ
// The same weights four at a time for a segment chosen at run time: seg
// (0..7) is elements 4*seg .. 4*seg+3 of the low half (seg < 4) or
// 16 + 4*(seg-4) .. of the high half. The word is selected, not indexed,
// so the chunk stays in registers.
DEVI void kq_weights4(const Chunk& ch, int seg, float (&wv)[4]) {
#if WTYPE == Q4_K
    const u32* h = nullptr;
#else
    const u32* h = ch.h;
#endif
    const int t = seg & 3;
    const u32 w = t == 0 ? ch.w[0] : t == 1 ? ch.w[1] : t == 2 ? ch.w[2] : ch.w[3];
    const u32 q = seg < 4 ? kq_lo(w, h, t) : kq_hi(w, h, t);
#if WTYPE == Q6_K
    const float d = seg < 4 ? ch.d : ch.d2;
#endif
#pragma unroll
    for (int b = 0; b < 4; ++b) {
#if WTYPE == Q6_K
        wv[b] = d * kq_f6(q, b);
#else
        wv[b] = fmaf(kq_f(q, b), ch.d, -ch.d2);
#endif
    }
}

// acc[m][r][t] += the group's dot with each of NT (5..8) tokens. With the
// token-major order of chunk_dot the compiler hoists all NT x 8 activation
// loads of a group (one group's activations per token) next to the k-quant
// chunk state (second scale, high-bit words) and spills under newer NVRTC
// releases. Here a loop unrolled twice walks the eight segments: per
// iteration eight weights per row and two 16-byte activation loads per
// token are live.
template <int NT>
DEVI void kq_group_fma(const Chunk (&ch)[NMAT][ROWS], const float* __restrict__ x, int xstride, int e,
                       float (&acc)[NMAT][ROWS][NT]) {
#pragma unroll 2
    for (int seg = 0; seg < 8; ++seg) {
        float wv[NMAT][ROWS][4];
#pragma unroll
        for (int m = 0; m < NMAT; ++m)
#pragma unroll
            for (int r = 0; r < ROWS; ++r) kq_weights4(ch[m][r], seg, wv[m][r]);
        const int off = XPOS(e) + (seg >> 2) * 16 + (seg & 3) * 4;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float4 xv = XLD4(x + (u64)t * xstride + off);
#pragma unroll
            for (int m = 0; m < NMAT; ++m)
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    float a = acc[m][r][t];
                    a = fmaf(wv[m][r][0], xv.x, a);
                    a = fmaf(wv[m][r][1], xv.y, a);
                    a = fmaf(wv[m][r][2], xv.z, a);
                    a = fmaf(wv[m][r][3], xv.w, a);
                    acc[m][r][t] = a;
                }
        }
    }
}
#endif

template <int NT>
DEVI void gemv_body(const u8* __restrict__ wq, const u16* __restrict__ wd,
                    const u8* __restrict__ wq2, const u16* __restrict__ wd2,
                    const float* __restrict__ x, const i8* __restrict__ xq, const float2* __restrict__ xds,
                    float* __restrict__ y, int n, int k, const float* __restrict__ side, int side_stride,
                    const float* h_in, float* h_out, const float* __restrict__ w_add,
                    const float* __restrict__ scale, const float* __restrict__ w_out, void* tout,
                    float2* tout_ds, unsigned* scratch, float eps) {
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
#if ALGO == 2
    // The first chunks of this lane's rows head for L2 (before the wait of
    // a chained launch, then while the block splits x), so the weight
    // stream does not start from cold after it.
    if (active) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int c = slice * 32 + lane + i * 32 * KSPLIT;
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                if (c < k / CHUNK) prefetch_l2(wq + (u64)min(row0 + r, n - 1) * (k / 2) + (u64)c * 16);
        }
    }
#endif
    const int nchunks = active ? k / CHUNK : 0;
    const int step = 32 * KSPLIT;
    const int cfirst = slice * 32 + lane;
    // Issues the loads of this lane's UNROLL chunks from c0 on (c0 <
    // nchunks) into ch.
    auto load_chunks = [&](Chunk (&ch)[UNROLL][NMAT][ROWS], int c0) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            // Chunks past the end re-read chunk c0; their math is skipped.
            const int c = c0 + u * step < nchunks ? c0 + u * step : c0;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                // Rows past the end re-read the last row; their sums are dropped.
                const int row = min(row0 + r, n - 1);
                ch[u][0][r] = load_chunk(wq, wd, row, c, k);
#if FUSE == 1
                ch[u][1][r] = load_chunk(wq2, wd2, row, c, k);
#endif
            }
        }
    };
#if PRELOAD
    // The lane's first UNROLL chunks are loaded before the wait: the
    // weights are written by no grid of the step, so under a chained
    // launch their latency overlaps the tail of the grid ahead.
    Chunk ch0[UNROLL][NMAT][ROWS];
    if (cfirst < nchunks) load_chunks(ch0, cfirst);
#if PRELOAD == 2
    // And the quant bytes of its next two rounds of chunks head for L2.
#pragma unroll
    for (int i = 1; i <= 2; ++i)
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int c = cfirst + (i * UNROLL + u) * step;
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                if (c < nchunks) {
                    prefetch_chunk(wq, min(row0 + r, n - 1), c, k);
#if FUSE == 1
                    prefetch_chunk(wq2, min(row0 + r, n - 1), c, k);
#endif
                }
        }
#endif
#endif
    pdl_enter();
#if XSMEM
    // The block's copy of x: token t's row at xa + t * xstride, group g at
    // 36 g (XPOS). Every thread copies, then waits, before any chunk.
    extern __shared__ float4 xs4[];
    const int xstride = (k / 32) * 36;
    {
        const int per_row = k / 4;
        for (int i = threadIdx.x; i < NT * per_row; i += blockDim.x) {
            const int t = i / per_row, q = i - t * per_row;
            xs4[(t * xstride) / 4 + (q >> 3) * 9 + (q & 7)] =
                __ldg(reinterpret_cast<const float4*>(x + (u64)t * k) + q);
        }
        __syncthreads();
    }
    const float* xa = reinterpret_cast<const float*>(xs4);
#else
    const int xstride = k;
    const float* xa = x;
#endif
#if ALGO == 2
    // The block's split activations: token t, group g at xsp[t * (k/32) + g].
    extern __shared__ XSplit xsp[];
    split_rows(x, xsp, NT, k);
    __syncthreads();
#elif ALGO == 3
    // The producer's split records: token t, group g at xsp[t * (k/32) + g].
    const XSplit* __restrict__ xsp = reinterpret_cast<const XSplit*>(xq);
#endif
    (void)xa;
    (void)xstride;
    // Adds this lane's UNROLL chunks from c0 on (loaded into ch) to acc.
    auto dot_chunks = [&](const Chunk (&ch)[UNROLL][NMAT][ROWS], int c0) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int c = c0 + u * step;
            if (c < nchunks) {
                const int e = c * CHUNK;
#if ALGO == 0 && KQ
                if constexpr (NT > 4) {
                    kq_group_fma<NT>(ch[u], xa, xstride, e, acc);
                    continue;
                }
#endif
#pragma unroll
                for (int t = 0; t < NT; ++t) {
#pragma unroll
                    for (int m = 0; m < NMAT; ++m)
#pragma unroll
                        for (int r = 0; r < ROWS; ++r) {
#if ALGO == 0
                            acc[m][r][t] += chunk_dot(ch[u][m][r], xa + (u64)t * xstride, e);
#elif ALGO == 2
                            acc[m][r][t] += chunk_dot_split(ch[u][m][r], xsp[t * (k / 32) + c]);
#elif ALGO == 3 && KQ
                            acc[m][r][t] += chunk_dot_split(ch[u][m][r], split_load(xsp + t * (k / 32) + c));
#elif ALGO == 3 && WTYPE == Q8_0
                            acc[m][r][t] += chunk_dot_split(
                                ch[u][m][r], split_load_half(xsp + t * (k / 32) + c / 2, c & 1), 0);
#elif ALGO == 3
                            acc[m][r][t] += chunk_dot_split(ch[u][m][r], split_load(xsp + t * (k / 32) + c), 0);
#else
                            acc[m][r][t] += chunk_dot_q8(ch[u][m][r], xq + (u64)t * k, xds + (u64)t * (k / 32), e);
#endif
                        }
                }
            }
        }
    };
    int c0 = cfirst;
#if PRELOAD
    // The chunks loaded before the wait first; then the loop as without
    // PRELOAD, from the lane's next chunks on.
    if (c0 < nchunks) {
        dot_chunks(ch0, c0);
        c0 += step * UNROLL;
    }
#endif
    for (; c0 < nchunks; c0 += step * UNROLL) {
        Chunk ch[UNROLL][NMAT][ROWS];
        load_chunks(ch, c0);
        dot_chunks(ch, c0);
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
#if OUT == F32 && !TAIL
    if (slice != 0) return;
#endif
    if (slice == 0 && lane == 0) {
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
#if OUT == F32
    if (lane == 0 && slice == 0 && active) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (row0 + r < n) {
#pragma unroll
                for (int t = 0; t < NT; ++t)
                    y[(u64)t * n + row0 + r] =
                        gemv_value(acc[0][r][t], acc[NMAT - 1][r][t], side, side_stride, t, row0 + r);
            }
        }
    }
#else
    // The block's BLOCK_ROWS outputs of each token meet in shared memory,
    // then leave as split Q8 records (q8_split.cuh), one per 32 rows and
    // token, the next GEMV's ALGO 3 input: y is XSplit[NT][n / 32] (n a
    // multiple of 32, so a 32-row group is wholly inside or past n).
    __shared__ float ys[NT][BLOCK_ROWS];
    if (slice == 0 && lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                ys[t][group * ROWS + r] = row0 + r < n ? gemv_value(acc[0][r][t], acc[NMAT - 1][r][t], side,
                                                                     side_stride, t, row0 + r)
                                                        : 0.f;
            }
    }
    __syncthreads();
    XSplit* rec = reinterpret_cast<XSplit*>(y);
    const int ngroups = BLOCK_ROWS / 32;
    split_store_rows(&ys[0][0], BLOCK_ROWS, NT, ngroups, blockIdx.x * ngroups, n / 32,
                     [&](int t) { return rec + (u64)t * (n / 32); });
#endif
#if TAIL
    // The block's sum of squares of its outputs per token (f32, in row
    // order), for the tail's norm of y: the last block adds the blocks'
    // sums in block order instead of reading all of y back first.
    __shared__ float tail_ss[WARPS / KSPLIT][NT];
    float* partial = reinterpret_cast<float*>(scratch) + TAIL_PARTIALS;
    if (lane == 0 && slice == 0) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            float ss = 0.0f;
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                if (active && row0 + r < n) ss = fmaf(acc[0][r][t], acc[0][r][t], ss);
            tail_ss[group][t] = ss;
        }
    }
    __syncthreads();
    if (threadIdx.x < NT) {
        float ss = 0.0f;
#pragma unroll
        for (int g = 0; g < WARPS / KSPLIT; ++g) ss += tail_ss[g][threadIdx.x];
        partial[(u64)blockIdx.x * NT + threadIdx.x] = ss;
    }
    if (tail_last_block(scratch))
        sandwich_rows<TAIL_OUT>(y, NT, n, partial, (int)gridDim.x, h_in, h_out, w_add, scale, w_out, tout,
                                tout_ds, eps);
#else
    (void)h_in, (void)h_out, (void)w_add, (void)scale, (void)w_out, (void)tout, (void)tout_ds, (void)scratch,
        (void)eps;
#endif
}

#define GEMV_ENTRY(NT)                                                                          \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, 1) gemv_n##NT(                     \
        const u8* wq, const u16* wd, const u8* wq2, const u16* wd2, const float* x,            \
        const i8* xq, const float2* xds, float* y, int n, int k, const float* side,            \
        int side_stride, const float* h_in, float* h_out, const float* w_add,                   \
        const float* scale, const float* w_out, void* tout, float2* tout_ds, unsigned* scratch, \
        float eps) {                                                                            \
        gemv_body<NT>(wq, wd, wq2, wd2, x, xq, xds, y, n, k, side, side_stride, h_in, h_out,    \
                      w_add, scale, w_out, tout, tout_ds, scratch, eps);                        \
    }
GEMV_ENTRY(1)
GEMV_ENTRY(2)
GEMV_ENTRY(3)
GEMV_ENTRY(4)
GEMV_ENTRY(5)
GEMV_ENTRY(6)
GEMV_ENTRY(7)
GEMV_ENTRY(8)
