// moe_gemv.cu: the expert half of a mixture-of-experts FFN for a decode
// step of 1..8 tokens, over the chosen experts only. Two stages, one per
// variant (STAGE), each with one entry per token count NT:
//
//   GATE_UP (moe_gemv_gate_up_n1 .. _n8): for every (token t, slot j) with
//     expert e = ids[t][j]:
//       h[t*K + j][r] = gelu_tanh(G_e[r] . x_t) * (U_e[r] . x_t),  r < ffn
//     G_e / U_e are rows 0..ffn / ffn..2ffn of expert e's block of the
//     gate_up tensor (E * 2*ffn rows of d; ggml ne [d, 2*ffn, E]).
//   DOWN (moe_gemv_down_n1 .. _n8):
//       y[t][r] = sum_j weights[t][j] * (D_e[r] . h[t*K + j]),  r < d
//     D_e rows e*d .. e*d + d of the down tensor (E * d rows of ffn; ggml
//     ne [ffn, d, E]); per lane the sum runs over its (expert, chunk) units
//     in walk order (below), each product weighted as it is added.
//
// ids i32 [NT][K] and weights f32 [NT][K] are moe_route's outputs (K =
// n_used): a token's K ids are distinct; a pair whose id is outside
// 0..E-1 is skipped (its h row is not written and it adds nothing).
// x f32 [NT][d], h f32 [NT*K][ffn], y f32 [NT][d]; rows 16-byte aligned.
//
// Grouping: every block reads the NT*K ids and lists the distinct experts
// in order of first appearance (token-major, slot order) with, per expert,
// the pairs that chose it in pair order. A block works on whole
// experts, so an expert chosen by several tokens has its rows read once
// for all of them: GATE_UP's grid.y walks the distinct experts (blocks past
// the count exit), DOWN's warps loop over them.
//
// Prologue: a block's first weight loads need the grouping (which expert),
// and under ALGO 1 and 2 its products need the quantized activations.
// HOIST=0 quantizes, then groups (the grouping's barriers publish the
// quantized values), then loads; HOIST=1 groups, issues each lane's first
// UNROLL chunks (units), then quantizes and passes one more barrier, so the
// activations' loads and reduction run under the weights' first latency.
// The same chunks meet the same values in the same order either way.
//
// PRELOAD=1 moves work ahead of the chained launch's wait (pdl_enter) that
// reads only what a grid two or more launches back wrote. The engine
// launches moe_route, GATE_UP and DOWN one after another, each a
// programmatic dependent of the one before (engine/src/cuda/moe.rs), and
// each of those waits before it releases its dependents (pdl_enter). So a
// block of this grid starts only after every block of its predecessor has
// passed its wait, that is after every grid before the predecessor has
// completed and its writes have reached L2: DOWN may group the experts
// (moe_route's ids) and issue its first UNROLL units before the wait,
// GATE_UP may quantize x (written by the attention residual, launches
// before moe_route) into shared memory before it. What the predecessor
// writes (GATE_UP: ids; DOWN: h) is still read after the wait. The early
// reads go through L2 (ld.global.cg): a line of the same buffer that an
// earlier layer's launch left in this SM's L1 may be stale. Under ALGO 1
// and 2 DOWN then quantizes h after the wait, in HOIST's order. The same
// chunks meet the same values in the same order as with PRELOAD=0.
// PRELOAD=2 (GATE_UP, HOIST=1) takes the whole prologue before the wait:
// grouping (the ids), the first UNROLL chunks and x's quantization. It is
// for an engine that launches moe_route before the shared MLP, so that at
// least one grid stands between the router and GATE_UP and the ids are two
// or more launches back too; nothing is read after the wait. Every block
// still waits, the ones with no expert too, so that the grid completes
// after its predecessor and the chain's order holds for the grids after.
//
// Weights: the expert tensor as one matrix of E * rows rows, in the layout
// of the dense GEMV (gemv.cu, gemv_chunk.cuh): LAYOUT 0 GGUF blocks (Q8_0,
// Q4_0, Q6_K; F16 / BF16 values), LAYOUT 1 planes (Q8_0 / Q4_0 quant and
// f16 scale planes; Q4_K / Q5_K / Q6_K nibble plane and GEMV side records;
// F16 / BF16 values).
//
// Arithmetic (ALGO): 0 = every weight dequantized exactly (ggml's values)
// and multiplied with fp32 FMA on the f32 activations (contract fp). 1 =
// each block first quantizes the activations it reads into Q8_1 in shared
// memory (quantize_q8_1.cu's rule: per 32 values d = amax / 127, q =
// roundf(x / d), the sum of the q), then takes dp4a dot products of the
// integer weights with them, scaled per 32 (gemv_chunk.cuh's ALGO 1;
// contract approx, replayed exactly by the CPU on the same Q8_1 values).
// 2 = the same with split Q8 activations (q8_split.cuh: two int8 planes
// per 32 values, x ~ d1 q1 + d2 q2, about 15 bits; gemv.cu ALGO 2's
// rule, written by split_write4) and two dp4a per weight word (contract
// approx at the split's 1e-4, replayed on the same records' values).
// 3 (DOWN only) = the split records of ALGO 2, read from global memory
// where GATE_UP wrote them (H_RECORDS=1), so no DOWN block quantizes h:
// the same records bit for bit (the same f32 values through the same
// rule), hence the same sums as ALGO 2 (contract approx, the same replay).
// The FMA form reads 4 bytes of activations per weight from L1, 64 bytes
// for a lane's 16-byte weight chunk, and converts every weight; the dp4a
// forms read 16 (Q8_1) or 32 (split) bytes from shared memory per chunk and
// convert nothing. GATE_UP quantizes x [NT][d], DOWN all NT*K rows of h,
// each block the whole of it, with the loads of several stretches per
// warp in flight before any is converted. Weight types: Q8_0, Q4_0 (either
// layout) and Q4_K / Q5_K / Q6_K planes (ALGO 3: planes, LAYOUT 1).
//
// H_RECORDS (GATE_UP): 0 writes h as f32 [NT*K][ffn]; 1 writes it as the
// split records DOWN's ALGO 3 reads, XSplit [NT*K][ffn / 32] (80 bytes per
// 32 values, inside the f32 buffer's size): the block's WARPS*ROWS rows
// (a multiple of 32) meet in shared memory per pair and leave as whole
// records. A DOWN block then starts streaming weights at once, where ALGO
// 2 has each of its blocks split every pair's h row first.
//
// Grid: GATE_UP (ceil(ffn / (WARPS*ROWS)), min(E, NT*K)); DOWN
// (ceil(d / ((WARPS/KSPLIT)*ROWS)), 1); block WARPS*32 threads. GATE_UP:
// warp w of block b owns ROWS consecutive rows from (b*WARPS + w)*ROWS and
// its lanes walk the row's chunks lane, lane+32, .... DOWN: the warps form
// WARPS/KSPLIT groups of KSPLIT; group g of block b owns ROWS rows from
// (b*(WARPS/KSPLIT) + g)*ROWS, and lane l of its warp s walks the units
// u*nchunks + c (distinct expert u in grouping order, chunk c of that
// expert's row) s*32 + l, stepping 32*KSPLIT, so the step's experts form
// one stream per row, split over the group's warps. Each lane loads UNROLL
// chunks (units) of its ROWS rows before using any; shuffles reduce each
// warp and, with KSPLIT > 1, the group's partial sums meet in shared memory
// (slice order). Every output element is written exactly once.
// Contract: ALGO 0 fp (reassociated f32 sums of exactly dequantized
// weights; GELU in f32 with tanhf); ALGO 1, 2 and 3 approx (the Q8_1 or
// split activations), tight against the CPU replay on the same values;
// H_RECORDS=1 adds the split of h (about 1e-5 of its RMS) to GATE_UP's.
//
// COUNT_BYTES = 1 (tests): each warp adds, per expert, the device bytes of
// the weight rows it reads (the rows it owns, quants and scales) to
// count[e] (u64 [E], zeroed by the caller), so a test can assert that only
// the chosen experts are read, each once per launch. 0: count is unused.
//
// Defines:
//   WTYPE        expert weight type: Q8_0 | Q4_0 | Q4_K | Q5_K | Q6_K | F16 | BF16
//   LAYOUT       0 = GGUF blocks (2-byte loads), 1 = aligned planes (16-byte loads)
//   STAGE        GATE_UP | DOWN
//   ROWS         rows per warp: 1, 2, 4
//   WARPS        warps per block: 1, 2, 4, 8
//   UNROLL       chunks (DOWN: units) per lane loaded together: 1, 2, 4, 8
//                (GATE_UP: ROWS*UNROLL <= 8, DOWN: <= 16; the register budget)
//   KSPLIT       DOWN: warps sharing one group of rows, each walking one
//                32-unit stretch in turn: 1, 2, 4, 8, dividing WARPS
//                (GATE_UP: 1)
//   COUNT_BYTES  0 | 1: count the weight bytes read per expert into count[]
//   ALGO         0 = f32 activations, FMA; 1 = Q8_1 activations made per
//                block in dynamic shared memory (5/4 byte per value), dp4a;
//                2 = split Q8 records made per block (5/2 byte per value);
//                3 = (DOWN) split Q8 records GATE_UP wrote (H_RECORDS=1)
//   H_RECORDS    GATE_UP's h: 0 = f32, 1 = split Q8 records (DOWN: 0)
//   MINB         1, 2, 3, 4: the blocks per SM the one-token entry (_n1)
//                asks of the compiler (__launch_bounds__' minimum, which
//                caps its registers at 64K / (WARPS*32*MINB)); the
//                multi-token entries ask 1 (their accumulators need the
//                registers)
//   HOIST        ALGO 1, 2: 0 = the block quantizes the activations, then
//                groups the experts, then loads weights; 1 = it groups the
//                experts, issues each lane's first UNROLL chunks (units),
//                then quantizes while those loads are in flight (ALGO 0
//                and 3 quantize nothing: 0)
//   PRELOAD      0 = everything after the launch's wait; 1 = the work on
//                inputs of earlier grids before it (Prologue above): the
//                down stage groups and issues its first units, the gate|up
//                stage (ALGO 1 or 2, without HOIST) quantizes x; 2 = the
//                gate|up stage's whole prologue before it (grouping, first
//                units, x; ALGO 1 or 2 with HOIST), for the router launched
//                before the shared MLP

#ifndef WTYPE
#error "moe_gemv.cu needs WTYPE"
#endif
#ifndef LAYOUT
#error "moe_gemv.cu needs LAYOUT"
#endif
#ifndef STAGE
#error "moe_gemv.cu needs STAGE"
#endif
#ifndef ROWS
#error "moe_gemv.cu needs ROWS"
#endif
#ifndef WARPS
#error "moe_gemv.cu needs WARPS"
#endif
#ifndef UNROLL
#error "moe_gemv.cu needs UNROLL"
#endif
#ifndef COUNT_BYTES
#error "moe_gemv.cu needs COUNT_BYTES"
#endif
#ifndef KSPLIT
#error "moe_gemv.cu needs KSPLIT"
#endif
#ifndef ALGO
#error "moe_gemv.cu needs ALGO"
#endif
#ifndef H_RECORDS
#error "moe_gemv.cu needs H_RECORDS"
#endif
#ifndef MINB
#error "moe_gemv.cu needs MINB"
#endif
#ifndef HOIST
#error "moe_gemv.cu needs HOIST"
#endif
#ifndef PRELOAD
#error "moe_gemv.cu needs PRELOAD"
#endif

#define GATE_UP 1
#define DOWN 2

#include "common.cuh"
#include "kquant.cuh"
// Included here, outside the ALGO conditionals below: the source table
// inlines each file once, at its first #include (act_out.cuh's under
// ALGO 1 would hide it from ALGO 2).
#include "q8_split.cuh"

#if ALGO != 0 && ALGO != 1 && ALGO != 2 && ALGO != 3
#error "moe_gemv.cu: ALGO must be 0 (f32, FMA), 1 (Q8_1, dp4a), 2 (split Q8, dp4a) or 3 (split Q8 records of h, dp4a)"
#endif
#if ALGO == 3 && (STAGE != DOWN || LAYOUT != 1)
#error "moe_gemv.cu: ALGO 3 reads the h records GATE_UP wrote: STAGE=DOWN on planes (LAYOUT=1)"
#endif
#if H_RECORDS != 0 && (H_RECORDS != 1 || STAGE != GATE_UP || (WARPS * ROWS) % 32 != 0)
#error "moe_gemv.cu: H_RECORDS=1 is GATE_UP's, with WARPS * ROWS a multiple of 32 (whole records per block)"
#endif
#if ALGO != 0 && (IS_W16(WTYPE) || (WTYPE == Q6_K && LAYOUT == 0))
#error "moe_gemv.cu: ALGO 1, 2 and 3 read Q8_0 / Q4_0 weights or k-quant planes"
#endif

#if STAGE != GATE_UP && STAGE != DOWN
#error "moe_gemv.cu: STAGE must be GATE_UP or DOWN"
#endif
#if WTYPE != Q8_0 && WTYPE != Q4_0 && !IS_KQUANT(WTYPE) && !IS_W16(WTYPE)
#error "moe_gemv.cu: WTYPE must be Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, F16 or BF16"
#endif
#if (WTYPE == Q4_K || WTYPE == Q5_K) && LAYOUT != 1
#error "moe_gemv.cu: Q4_K / Q5_K weights are read as planes (LAYOUT=1)"
#endif
#if ROWS != 1 && ROWS != 2 && ROWS != 4
#error "moe_gemv.cu: ROWS must be 1, 2 or 4"
#endif
#if WARPS != 1 && WARPS != 2 && WARPS != 4 && WARPS != 8
#error "moe_gemv.cu: WARPS must be 1, 2, 4 or 8"
#endif
#if UNROLL != 1 && UNROLL != 2 && UNROLL != 4 && UNROLL != 8
#error "moe_gemv.cu: UNROLL must be 1, 2, 4 or 8"
#endif
#if KSPLIT != 1 && KSPLIT != 2 && KSPLIT != 4 && KSPLIT != 8
#error "moe_gemv.cu: KSPLIT must be 1, 2, 4 or 8"
#endif
#if WARPS % KSPLIT != 0 || (STAGE == GATE_UP && KSPLIT != 1)
#error "moe_gemv.cu: KSPLIT must divide WARPS (and be 1 for GATE_UP)"
#endif
#if MINB != 1 && MINB != 2 && MINB != 3 && MINB != 4
#error "moe_gemv.cu: MINB must be 1, 2, 3 or 4"
#endif
#if HOIST != 0 && (HOIST != 1 || (ALGO != 1 && ALGO != 2))
#error "moe_gemv.cu: HOIST=1 overlaps the block's quantization of the activations (ALGO 1, 2) with its first weight loads"
#endif
#if PRELOAD != 0 && PRELOAD != 1 && PRELOAD != 2
#error "moe_gemv.cu: PRELOAD must be 0, 1 or 2"
#endif
#if PRELOAD == 1 && STAGE == GATE_UP && (HOIST || (ALGO != 1 && ALGO != 2))
#error "moe_gemv.cu: GATE_UP's PRELOAD=1 quantizes x before the wait (ALGO 1, 2; HOIST=0: HOIST's first loads need the ids)"
#endif
#if PRELOAD == 2 && (STAGE != GATE_UP || !HOIST)
#error "moe_gemv.cu: PRELOAD=2 is GATE_UP's HOIST order before the wait (STAGE=GATE_UP, HOIST=1)"
#endif
#if ROWS * UNROLL > (STAGE == GATE_UP ? 8 : 16)
#error "moe_gemv.cu: ROWS * UNROLL over the register budget (GATE_UP 8, DOWN 16)"
#endif

#if ALGO == 1
// The dp4a chunk products read the activations from shared memory.
#define GEMV_Q8_SHARED
#define OUT Q8_1
#include "act_out.cuh"
#endif
#include "gemv_chunk.cuh"

// Most experts per token (moe_route's bound).
#define MAX_USED 32

// Device bytes of one weight row of k elements in this layout.
DEVI u64 row_bytes(int k) {
#if IS_W16(WTYPE)
    return (u64)k * 2;
#elif LAYOUT == 0
    return WTYPE == Q8_0 ? (u64)k / 32 * 34 : WTYPE == Q4_0 ? (u64)k / 32 * 18 : (u64)k / 256 * 210;
#elif WTYPE == Q8_0
    return (u64)k + (u64)k / 32 * 2;
#elif WTYPE == Q4_0
    return (u64)k / 2 + (u64)k / 32 * 2;
#else
    return (u64)k / 2 + (u64)k / 256 * (WTYPE == Q4_K ? 16 : WTYPE == Q5_K ? 48 : KQ6_REC);
#endif
}

// The distinct experts of the step in order of first appearance, and per
// expert the pairs (t*K + j) that chose it, in pair order, with their
// tokens. Built by every block from ids.
template <int NT>
struct Groups {
    int n;
    int expert[NT * MAX_USED];
    int cnt[NT * MAX_USED];
    short pair[NT * MAX_USED][NT];
    signed char tok[NT * MAX_USED][NT];
};

template <int NT>
DEVI void group_experts(const int* __restrict__ ids, int n_experts, int n_used, Groups<NT>& g) {
    __shared__ int s_id[NT * MAX_USED];
    __shared__ short s_first[NT * MAX_USED];
    const int np = NT * n_used;
    for (int i = threadIdx.x; i < np; i += blockDim.x) {
#if PRELOAD
        // DOWN reads the ids before its wait, through L2 (Prologue).
        const int e = __ldcg(ids + i);
#else
        const int e = __ldg(ids + i);
#endif
        s_id[i] = e >= 0 && e < n_experts ? e : -1;
    }
    __syncthreads();
    // The first pair that chose the same expert (-1: an invalid id).
    for (int i = threadIdx.x; i < np; i += blockDim.x) {
        const int e = s_id[i];
        int first = e < 0 ? -1 : i;
        for (int j = 0; j < i && e >= 0; ++j)
            if (s_id[j] == e) {
                first = j;
                break;
            }
        s_first[i] = (short)first;
    }
    __syncthreads();
    // The thread of each first appearance lists its expert's pairs.
    for (int i = threadIdx.x; i < np; i += blockDim.x) {
        if (s_first[i] != i) continue;
        int u = 0;
        for (int j = 0; j < i; ++j) u += s_first[j] == j;
        g.expert[u] = s_id[i];
        int c = 0;
        for (int j = i; j < np && c < NT; ++j)
            if (s_first[j] == i) {
                g.pair[u][c] = (short)j;
                g.tok[u][c] = (signed char)(j / n_used);
                ++c;
            }
        g.cnt[u] = c;
    }
    if (threadIdx.x == 0) {
        int n = 0;
        for (int j = 0; j < np; ++j) n += s_first[j] == j;
        g.n = n;
    }
    __syncthreads();
}

#if ALGO == 1 || ALGO == 2
// Stretches of 128 values per warp whose loads are in flight together.
#define Q8_BATCH 8

// The activations src[n] (n % 32 == 0) quantized into shared memory at
// dst: ALGO 1 the Q8_1 of act_out.cuh's rule (q[n], then n / 32 (d, sum)
// pairs), ALGO 2 split_write4's records (n / 32 of them, q8_split.cuh's
// rule). A warp takes 128 consecutive values, 4 per lane, the 8 lanes of
// a 32-value group reducing it together (4 groups per warp instruction,
// not one group per warp in turn: the reductions of one group are a
// dependent chain), the warps strided over the array.
DEVI void quantize_to_shared(const float* __restrict__ src, u8* dst, int n) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int step = WARPS * 128;
    for (int b0 = warp * 128; b0 < n; b0 += step * Q8_BATCH) {
        float4 v[Q8_BATCH];
#pragma unroll
        for (int i = 0; i < Q8_BATCH; ++i) {
            const int e = b0 + i * step + lane * 4;
#if PRELOAD
            // GATE_UP quantizes x before its wait, through L2 (Prologue).
            v[i] = e < n ? __ldcg(reinterpret_cast<const float4*>(src + e)) : make_float4(0.f, 0.f, 0.f, 0.f);
#else
            v[i] = e < n ? __ldg(reinterpret_cast<const float4*>(src + e)) : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
        }
#pragma unroll
        for (int i = 0; i < Q8_BATCH; ++i) {
            const int base = b0 + i * step;  // the same on every lane of the warp
            if (base >= n) break;
            const int e = base + lane * 4;
#if ALGO == 1
            act_write4(dst, reinterpret_cast<float2*>(dst + n), (u64)e, v[i], e < n);
#else
            split_write4(reinterpret_cast<XSplit*>(dst) + e / 32, e & 31, v[i], e < n);
#endif
        }
    }
}

#endif
#if ALGO == 1 || ALGO == 2
// The quantized activations: ALGO 1 n int8 values, then n / 32 (d, sum)
// pairs; ALGO 2 n / 32 split records.
extern __shared__ __align__(16) u8 q8_smem[];
#endif
#if ALGO == 2
// The chunk at element el of a row whose split records start at rec.
DEVI float split_dot(const Chunk& ch, const XSplit* rec, int el) {
#if KQ
    return chunk_dot_split(ch, rec[el / 32]);
#else
    return chunk_dot_split(ch, rec[el / 32], el % 32);
#endif
}
#elif ALGO == 3
// The same product on records in global memory: a Q8_0 plane chunk (16
// elements) loads only its half of the record (split_load_half, three
// 16-byte loads), a 32-element chunk the whole record.
DEVI float split_dot(const Chunk& ch, const XSplit* __restrict__ rec, int el) {
#if KQ
    return chunk_dot_split(ch, split_load(rec + el / 32));
#elif WTYPE == Q8_0
    return chunk_dot_split(ch, split_load_half(rec + el / 32, (el / 16) & 1), 0);
#else
    return chunk_dot_split(ch, split_load(rec + el / 32), 0);
#endif
}
#endif

// acc[tt] += v for tt == t: a run-time token index into a register array
// without local memory (every element is selected, none indexed).
template <int NT>
DEVI void add_at(float (&acc)[NT], int t, float v) {
#pragma unroll
    for (int tt = 0; tt < NT; ++tt)
        if (tt == t) acc[tt] += v;
}
template <int NT>
DEVI float pick(const float (&acc)[NT], int t) {
    float v = 0.f;
#pragma unroll
    for (int tt = 0; tt < NT; ++tt)
        if (tt == t) v = acc[tt];
    return v;
}

// The token loops below run over an expert's pairs at run time (one pair's
// activations in registers at a time): unrolled over the NT tokens, the
// compiler hoists every token's activation loads next to the chunk and
// passes the 255-register ceiling.
#if STAGE == GATE_UP
// The UNROLL chunks c0, c0 + 32, ... of the lane's ROWS gate and up rows
// (rows from row0 of the expert's block at base), loaded before any is
// used: 2 x ROWS x UNROLL loads in flight per lane.
DEVI void load_gate_up(Chunk (&ch)[UNROLL][2][ROWS], const u8* __restrict__ wq, const u16* __restrict__ wd,
                       int base, int row0, int c0, int nchunks, int d, int ffn) {
#pragma unroll
    for (int v = 0; v < UNROLL; ++v) {
        // Chunks past the row's end re-read its last chunk (skipped by the caller).
        const int c = min(c0 + 32 * v, nchunks - 1);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            // Rows past the end re-read the last row; their sums are dropped.
            const int row = min(row0 + r, ffn - 1);
            ch[v][0][r] = load_chunk(wq, wd, base + row, c, d);
            ch[v][1][r] = load_chunk(wq, wd, base + ffn + row, c, d);
        }
    }
}

template <int NT>
DEVI void gate_up_body(const u8* __restrict__ wq, const u16* __restrict__ wd, const float* __restrict__ x,
                       const int* __restrict__ ids, float* __restrict__ h, unsigned long long* __restrict__ count,
                       int d, int ffn, int n_experts, int n_used) {
    __shared__ Groups<NT> g;
#if PRELOAD == 1
    // x was written launches before moe_route, this grid's predecessor:
    // quantized before the wait (Prologue); group_experts' barriers
    // publish it.
    quantize_to_shared(x, q8_smem, NT * d);
#endif
#if PRELOAD != 2
    pdl_enter();
#endif
#if ALGO == 1 || ALGO == 2
#if !HOIST && !PRELOAD
    // Every token's x: group_experts' barriers publish it.
    quantize_to_shared(x, q8_smem, NT * d);
#endif
#if ALGO == 1
    const i8* xq = reinterpret_cast<const i8*>(q8_smem);
    const float2* xds = reinterpret_cast<const float2*>(q8_smem + NT * d);
#elif ALGO == 2
    const XSplit* xs = reinterpret_cast<const XSplit*>(q8_smem);
#endif
#endif
    group_experts<NT>(ids, n_experts, n_used, g);
    const int u = blockIdx.y;
    if (u >= g.n) {  // the whole block (u and g.n are the same on every thread)
#if PRELOAD == 2
        pdl_enter();
#endif
        return;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = (blockIdx.x * WARPS + warp) * ROWS;
    const bool active = row0 < ffn;
#if !H_RECORDS && !HOIST
    if (!active) return;
#endif
    const int e = g.expert[u], cnt = g.cnt[u];
    const int base = e * 2 * ffn;
    float acc[2][ROWS][NT];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[m][r][t] = 0.f;
    // Warps past the rows (H_RECORDS=1 or HOIST=1) still reach the barriers
    // below (HOIST=1: they also take their part of the quantization).
    const int nchunks = active ? d / CHUNK : 0;
#if HOIST
    // The loop's first chunks are in flight while the block quantizes x;
    // the barrier publishes it. Every thread still running reaches it: the
    // only return above is the whole block's.
    Chunk ch[UNROLL][2][ROWS];
    if (lane < nchunks) load_gate_up(ch, wq, wd, base, row0, lane, nchunks, d, ffn);
    quantize_to_shared(x, q8_smem, NT * d);
    __syncthreads();
#if PRELOAD == 2
    // The prologue read only what grids two or more launches back wrote.
    pdl_enter();
#endif
#if !H_RECORDS
    if (!active) return;
#endif
#endif
    for (int c0 = lane; c0 < nchunks; c0 += 32 * UNROLL) {
#if HOIST
        if (c0 != lane) load_gate_up(ch, wq, wd, base, row0, c0, nchunks, d, ffn);
#else
        Chunk ch[UNROLL][2][ROWS];
        load_gate_up(ch, wq, wd, base, row0, c0, nchunks, d, ffn);
#endif
#pragma unroll
        for (int v = 0; v < UNROLL; ++v) {
            const int c = c0 + 32 * v;
            if (c >= nchunks) break;
            const int el = c * CHUNK;
#pragma unroll 1
            for (int i = 0; i < cnt; ++i) {
                const int t = g.tok[u][i];
#if ALGO == 1
                const i8* xqr = xq + t * d;
                const float2* xdr = xds + t * (d / 32);
#pragma unroll
                for (int m = 0; m < 2; ++m)
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) add_at<NT>(acc[m][r], t, chunk_dot_q8(ch[v][m][r], xqr, xdr, el));
#elif ALGO == 2
                const XSplit* xr = xs + t * (d / 32);
#pragma unroll
                for (int m = 0; m < 2; ++m)
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) add_at<NT>(acc[m][r], t, split_dot(ch[v][m][r], xr, el));
#else
                const float* xr = x + (u64)t * d;
#pragma unroll
                for (int m = 0; m < 2; ++m)
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) add_at<NT>(acc[m][r], t, chunk_dot(ch[v][m][r], xr, el));
#endif
            }
        }
    }
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[m][r][t] = warp_sum(acc[m][r][t]);
#if H_RECORDS
    // The block's WARPS*ROWS values of each pair meet in shared memory,
    // then leave as split records: pair p's row of records at
    // h + p * (ffn / 32) records, this block's from record
    // blockIdx.x * (WARPS*ROWS / 32). ffn is a multiple of 32, so a 32-row
    // group is wholly inside the rows or past them.
    __shared__ float hv[NT][WARPS * ROWS];
    if (lane == 0 && active)
        for (int i = 0; i < cnt; ++i) {
            const int t = g.tok[u][i];
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                hv[i][warp * ROWS + r] = gelu_tanh(pick<NT>(acc[0][r], t)) * pick<NT>(acc[1][r], t);
        }
    __syncthreads();
    XSplit* rec = reinterpret_cast<XSplit*>(h);
    const int ngroups = WARPS * ROWS / 32;
    split_store_rows(&hv[0][0], WARPS * ROWS, cnt, ngroups, blockIdx.x * ngroups, ffn / 32,
                     [&](int i) { return rec + (u64)g.pair[u][i] * (ffn / 32); });
#else
    if (lane == 0) {
        for (int i = 0; i < cnt; ++i) {
            const int t = g.tok[u][i];
            float* hr = h + (u64)g.pair[u][i] * ffn;
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                if (row0 + r < ffn) hr[row0 + r] = gelu_tanh(pick<NT>(acc[0][r], t)) * pick<NT>(acc[1][r], t);
        }
    }
#endif
#if COUNT_BYTES
    if (lane == 0 && active) atomicAdd(count + e, 2ull * (u64)min(ROWS, ffn - row0) * row_bytes(d));
#else
    (void)count;
#endif
}

#define MOE_ENTRY(NT)                                                                                      \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, (NT) == 1 ? MINB : 1) moe_gemv_gate_up_n##NT( \
        const u8* wq, const u16* wd, const float* x, const int* ids, float* h, unsigned long long* count,  \
        int d, int ffn, int n_experts, int n_used) {                                                       \
        gate_up_body<NT>(wq, wd, x, ids, h, count, d, ffn, n_experts, n_used);                             \
    }
#else
// The lane's next UNROLL units from (uu, cc) (distinct expert, chunk),
// stepping 32*KSPLIT units, of its ROWS rows from row0, loaded before any
// is used: UNROLL x ROWS loads in flight. un / cn receive the units;
// (uu, cc) move on to the unit after them.
template <int NT>
DEVI void load_down(Chunk (&ch)[UNROLL][ROWS], int (&un)[UNROLL], int (&cn)[UNROLL], int& uu, int& cc,
                    const u8* __restrict__ wq, const u16* __restrict__ wd, const Groups<NT>& g, int row0, int nchunks,
                    int d, int ffn) {
#pragma unroll
    for (int v = 0; v < UNROLL; ++v) {
        un[v] = uu;
        cn[v] = cc;
        // Units past the end re-read the last unit (skipped by the caller).
        const int e = g.expert[min(uu, g.n - 1)];
        const int c = uu < g.n ? cc : nchunks - 1;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) ch[v][r] = load_chunk(wq, wd, e * d + min(row0 + r, d - 1), c, ffn);
        cc += 32 * KSPLIT;
        while (cc >= nchunks) {
            cc -= nchunks;
            ++uu;
        }
    }
}

template <int NT>
DEVI void down_body(const u8* __restrict__ wq, const u16* __restrict__ wd, const float* __restrict__ h,
                    const int* __restrict__ ids, const float* __restrict__ weights, float* __restrict__ y,
                    unsigned long long* __restrict__ count, int d, int ffn, int n_experts, int n_used) {
    __shared__ Groups<NT> g;
#if !PRELOAD
    pdl_enter();
#endif
#if ALGO == 3
    // GATE_UP's records of every pair's h row: hs[p * (ffn / 32) + g].
    const XSplit* hs = reinterpret_cast<const XSplit*>(h);
#elif ALGO != 0
#if !HOIST && !PRELOAD
    // Every pair's h row (a pair with an invalid id is quantized and never
    // read): group_experts' barriers publish it.
    quantize_to_shared(h, q8_smem, NT * n_used * ffn);
#endif
#if ALGO == 1
    const i8* hq = reinterpret_cast<const i8*>(q8_smem);
    const float2* hds = reinterpret_cast<const float2*>(q8_smem + NT * n_used * ffn);
#elif ALGO == 2
    const XSplit* hs = reinterpret_cast<const XSplit*>(q8_smem);
#endif
#endif
    group_experts<NT>(ids, n_experts, n_used, g);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = warp / KSPLIT, slice = warp % KSPLIT;
    const int row0 = (blockIdx.x * (WARPS / KSPLIT) + group) * ROWS;
    // Groups past the end still reach the barriers below (KSPLIT > 1; HOIST=1:
    // they also take their part of the quantization).
    const bool active = row0 < d;
#if KSPLIT == 1 && !HOIST && !PRELOAD
    if (!active) return;
#endif
    float acc[ROWS][NT];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
    const int nchunks = ffn / CHUNK;
    // The lane walks the (expert, chunk) units u * nchunks + c of its rows,
    // lane, lane + 32, ...: an expert row of the down stacks is a short
    // stream (44 chunks of Q8_0 planes at 26B-A4B's 704), so walking the
    // experts' rows as one stream keeps every lane busy. UNROLL units x ROWS
    // rows are loaded before any is used.
    const int nunits = active ? g.n * nchunks : 0;
    const int first = slice * 32 + lane;
    int uu = first / nchunks, cc = first % nchunks;  // the unit of q = q0
#if HOIST || PRELOAD
    // The loop's first units are in flight while the block quantizes h
    // (ALGO 1, 2; the barrier publishes it) or, PRELOAD=1, while the grid
    // ahead still runs. Every thread reaches the wait and the barrier (no
    // return above).
    Chunk ch[UNROLL][ROWS];
    int un[UNROLL], cn[UNROLL];
    if (first < nunits) load_down<NT>(ch, un, cn, uu, cc, wq, wd, g, row0, nchunks, d, ffn);
#if PRELOAD
    // Everything above read the ids and the weights; h comes from GATE_UP.
    pdl_enter();
#endif
#if ALGO == 1 || ALGO == 2
    // Every pair's h row (a pair with an invalid id is quantized and never
    // read).
    quantize_to_shared(h, q8_smem, NT * n_used * ffn);
    __syncthreads();
#endif
#if KSPLIT == 1
    if (!active) return;
#endif
#endif
    for (int q0 = first; q0 < nunits; q0 += 32 * KSPLIT * UNROLL) {
#if HOIST || PRELOAD
        if (q0 != first) load_down<NT>(ch, un, cn, uu, cc, wq, wd, g, row0, nchunks, d, ffn);
#else
        Chunk ch[UNROLL][ROWS];
        int un[UNROLL], cn[UNROLL];
        load_down<NT>(ch, un, cn, uu, cc, wq, wd, g, row0, nchunks, d, ffn);
#endif
#pragma unroll
        for (int v = 0; v < UNROLL; ++v) {
            const int u = un[v];
            if (u >= g.n) break;
            const int el = cn[v] * CHUNK;
            const int cnt = g.cnt[u];
#pragma unroll 1
            for (int i = 0; i < cnt; ++i) {
                const int p = g.pair[u][i];
                const float w = __ldg(weights + p);
#if ALGO == 1
                const i8* hqr = hq + p * ffn;
                const float2* hdr = hds + p * (ffn / 32);
#pragma unroll
                for (int r = 0; r < ROWS; ++r) add_at<NT>(acc[r], g.tok[u][i], w * chunk_dot_q8(ch[v][r], hqr, hdr, el));
#elif ALGO == 2 || ALGO == 3
                const XSplit* hr = hs + p * (ffn / 32);
#pragma unroll
                for (int r = 0; r < ROWS; ++r) add_at<NT>(acc[r], g.tok[u][i], w * split_dot(ch[v][r], hr, el));
#else
                const float* hr = h + (u64)p * ffn;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) add_at<NT>(acc[r], g.tok[u][i], w * chunk_dot(ch[v][r], hr, el));
#endif
            }
        }
    }
#if COUNT_BYTES
    // The group's slices read disjoint units of the same rows: counted once.
    if (lane == 0 && slice == 0 && active)
        for (int u = 0; u < g.n; ++u) atomicAdd(count + g.expert[u], (u64)min(ROWS, d - row0) * row_bytes(ffn));
#else
    (void)count;
#endif
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]);
#if KSPLIT > 1
    __shared__ float red[WARPS][ROWS * NT];
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) red[warp][r * NT + t] = acc[r][t];
    }
    __syncthreads();
    if (slice != 0 || !active) return;
    if (lane == 0) {
#pragma unroll
        for (int s = 1; s < KSPLIT; ++s)
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
#pragma unroll
                for (int t = 0; t < NT; ++t) acc[r][t] += red[warp + s][r * NT + t];
    }
#endif
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (row0 + r >= d) continue;
#pragma unroll
            for (int t = 0; t < NT; ++t) y[(u64)t * d + row0 + r] = acc[r][t];
        }
    }
}

#define MOE_ENTRY(NT)                                                                                      \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, (NT) == 1 ? MINB : 1) moe_gemv_down_n##NT(    \
        const u8* wq, const u16* wd, const float* h, const int* ids, const float* weights, float* y,       \
        unsigned long long* count, int d, int ffn, int n_experts, int n_used) {                            \
        down_body<NT>(wq, wd, h, ids, weights, y, count, d, ffn, n_experts, n_used);                       \
    }
#endif
MOE_ENTRY(1)
MOE_ENTRY(2)
MOE_ENTRY(3)
MOE_ENTRY(4)
MOE_ENTRY(5)
MOE_ENTRY(6)
MOE_ENTRY(7)
MOE_ENTRY(8)
