// stage_copy.cuh: the global -> shared copies of one pipeline stage of the
// prefill GEMMs (gemm_dq.cu, mmq.cu, gemm_wgmma.cu): the copy engine, and
// StageTile, the one loader of a stage's weight, activation and scale
// tiles.
//
// Copy engine: with CP_ASYNC = 1 the copies are cp.async to the shared
// address `dst` (zero-filled when !ok) and commit / wait_stages manage the
// groups; with CP_ASYNC = 0 they are plain loads and stores through the
// generic pointer `gdst`, and commit / wait_stages do nothing. The including
// file defines CP_ASYNC (a define of gemm_dq and mmq; gemm_wgmma, whose MMA
// reads shared memory through the async proxy, always copies with cp.async).
//
// Defines: (none of its own; uses the includer's CP_ASYNC)

#pragma once

DEVI void copy16(u32 dst, u8* gdst, const void* src, bool ok) {
#if CP_ASYNC
    (void)gdst;
    cp_async16(dst, src, ok ? 16 : 0);
#else
    (void)dst;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (ok) v = *reinterpret_cast<const uint4*>(src);
    *reinterpret_cast<uint4*>(gdst) = v;
#endif
}
DEVI void copy8(u32 dst, u8* gdst, const void* src, bool ok) {
#if CP_ASYNC
    (void)gdst;
    cp_async8(dst, src, ok ? 8 : 0);
#else
    (void)dst;
    uint2 v = make_uint2(0, 0);
    if (ok) v = *reinterpret_cast<const uint2*>(src);
    *reinterpret_cast<uint2*>(gdst) = v;
#endif
}
DEVI void copy4(u32 dst, u8* gdst, const void* src, bool ok) {
#if CP_ASYNC
    (void)gdst;
    cp_async4(dst, src, ok ? 4 : 0);
#else
    (void)dst;
    *reinterpret_cast<float*>(gdst) = ok ? *reinterpret_cast<const float*>(src) : 0.0f;
#endif
}
DEVI void commit() {
#if CP_ASYNC
    cp_async_commit();
#endif
}
template <int N> DEVI void wait_stages() {
#if CP_ASYNC
    cp_async_wait<N>();
#endif
}

// The element type of a `Bytes`-long record (a scale, a (d, sum) pair).
template <int Bytes> struct Record { struct T { u8 b[Bytes]; }; };
template <> struct Record<4> { typedef float T; };
template <> struct Record<8> { typedef float2 T; };

// One operand tile of a stage and this thread's share of copying it.
//
// The operand is a row-major global matrix whose rows hold K elements of
// BytesNum / BytesDen bytes each (f16 activations and F16 / BF16 weights
// 2/1, int8 quants 1/1, Q4_0 and k-quant nibbles 1/2, one f32 scale per 32
// elements 1/8, a Q8_1 (d, sum) pair per 32 elements 1/4, the k-quants'
// GEMM side words per 32 elements: Q4_K's two 1/4, Q5_K's and Q6_K's four
// 1/2). A stage holds KTile elements of k of Rows rows, copied in chunks of
// Chunk bytes (16; 8 for Q4_K's side words; 4 for scales) that each cover
// KPerChunk elements of k. A 4-byte chunk is one record of KPerChunk *
// BytesNum / BytesDen bytes (equal to 4 except where a chunk picks the
// first field of a longer record: the d of Q8_1's (d, sum) pairs); 16- and
// 8-byte chunks are whole. In shared memory the
// tile's rows are RowPitch bytes apart, chunks packed in order, or with
// Swizzle in the 128-byte swizzle (16-byte chunk c of row r at chunk
// c ^ (r % 8)).
//
// Threads take the chunks of a row in turn and Threads / chunks-per-row
// rows per pass, so each thread keeps one chunk column for the whole k loop
// and only its row moves; with Swizzle the rows a thread visits stay
// congruent mod 8, so its swizzled column is fixed too. STAGE_TILE_INIT
// computes once what a thread holds (its row-0 address, the rows left
// before the matrix edge, its first k, its shared offset); per k tile `copy`
// adds the tile's k offset, steps rows by a K-derived stride and tests k
// against K once. HoldStep keeps that stride in a register rather than
// recomputing it from K per tile: mmq holds its strides, gemm_dq and
// gemm_wgmma recompute theirs, each as the loader it replaced did (the
// compile report, scripts/compile-report.sh, measures the other choice as
// more registers in some variants). Rows past the edge and k past K are
// zero-filled (their source address is `base`, any valid address). K must
// be a multiple of 32.
template <int Chunk, int KPerChunk, int BytesNum, int BytesDen, int KTile, int Rows, int Threads,
          int RowPitch, bool Swizzle = false, bool HoldStep = false>
struct StageTile {
    enum : int {
        kChunk = Chunk,
        kKPerChunk = KPerChunk,
        kBytesNum = BytesNum,
        kBytesDen = BytesDen,
        kRowPitch = RowPitch,
        kSwizzle = Swizzle,
        kHoldStep = HoldStep,
        kChunksPerRow = KTile / KPerChunk,
        kRowStep = Threads / kChunksPerRow,  // rows per pass of all threads
        kPasses = (Rows + kRowStep - 1) / kRowStep,
        kRecord = KPerChunk * BytesNum / BytesDen,  // source bytes per 4-byte chunk
    };
    static_assert(Chunk == 16 || Chunk == 8 || Chunk == 4, "chunks are 16, 8 or 4 bytes");
    static_assert(KTile % KPerChunk == 0 && Threads % kChunksPerRow == 0,
                  "the chunks of a row must divide the threads");
    static_assert((kRowStep * BytesNum) % BytesDen == 0 && (KTile * BytesNum) % BytesDen == 0,
                  "row and tile steps must be whole bytes");
    static_assert(Chunk != 4 || kRecord == 4 || kRecord == 8, "4-byte chunks read 4- or 8-byte records");
    static_assert(Chunk == 4 || kRecord == Chunk, "16- and 8-byte chunks are whole");
    static_assert(!Swizzle || (Chunk == 16 && kChunksPerRow == 8 && kRowStep % 8 == 0),
                  "the swizzle needs 128-byte rows and row steps that keep row % 8");

    const u8* src;  // row 0 of this thread's chunk at k = 0
    u64 step;       // source bytes between passes (HoldStep only)
    int rows;       // rows from this thread's first one to the matrix edge
    int col;        // first k of this thread's chunk
    u32 off;        // stage-relative shared offset of its first chunk

    // Issues the copies of k tile `kt` into the stage at shared address
    // `st` (generic pointer `gst` for the synchronous engine).
    __device__ __forceinline__ void copy(u32 st, u8* gst, const u8* base, int kt, int K) const {
        const int k0 = kt * KTile;
        const bool kok = k0 + col < K;
        const u8* p;
        if constexpr (Chunk == 4)
            p = src + (k0 / KPerChunk) * kRecord;
        else if constexpr (BytesDen == 1 && BytesNum == 1)
            p = src + k0;
        else if constexpr (BytesDen == 1)
            p = src + (u64)k0 * BytesNum;
        else
            p = src + k0 / (BytesDen / BytesNum);
        const u64 pass = HoldStep ? step : (u64)(kRowStep * BytesNum / BytesDen) * (u32)K;
#pragma unroll
        for (int it = 0; it < kPasses; ++it) {
            if (Rows % kRowStep == 0 || it * kRowStep + (int)(threadIdx.x / kChunksPerRow) < Rows) {
                const bool ok = kok && it * kRowStep < rows;
                const u32 o = off + it * kRowStep * RowPitch;
                if (Chunk == 16)
                    copy16(st + o, gst + o, ok ? p : base, ok);
                else if (Chunk == 8)
                    copy8(st + o, gst + o, ok ? p : base, ok);
                else
                    copy4(st + o, gst + o, ok ? p : base, ok);
            }
            p += pass;
        }
    }
};

// Fills the StageTile `P` of type `Tile` for this thread: `mat` is the
// matrix, `row0` the tile's first row, `nrows` the matrix's rows, `K` its
// row length in elements, `region` the tile's offset inside a stage. A
// macro, expanded in the kernel's loader setup, rather than a function:
// the tiles' address terms (the same rows, the same K-derived strides) are
// then simplified together by the compiler, as in the loaders this one
// replaced; the same code as a function per tile measured 2 more registers
// per thread in some gemm_dq and mmq variants (the compiler simplifies a
// function's body before inlining it). The branches on the tile's
// constants fold at compile time.
#define STAGE_TILE_INIT(Tile, P, mat, row0, nrows, K, region)                                          \
    do {                                                                                             \
        const int st_t_ = threadIdx.x;                                                               \
        const int st_r_ = st_t_ / Tile::kChunksPerRow, st_c_ = st_t_ % Tile::kChunksPerRow;          \
        (P).rows = (nrows) - (row0) - st_r_;                                                         \
        (P).col = st_c_ * Tile::kKPerChunk;                                                          \
        const u8* st_m_ = reinterpret_cast<const u8*>(mat);                                          \
        if (Tile::kChunk == 4)                                                                       \
            (P).src = reinterpret_cast<const u8*>(                                                   \
                reinterpret_cast<const typename Record<Tile::kRecord>::T*>(mat) +                    \
                (u64)((row0) + st_r_) * ((K) / Tile::kKPerChunk) + st_c_);                           \
        else if (Tile::kBytesDen == 1 && Tile::kBytesNum == 1)                                       \
            (P).src = st_m_ + (u64)((row0) + st_r_) * (K) + st_c_ * Tile::kKPerChunk;                \
        else if (Tile::kBytesDen == 1)                                                               \
            (P).src = st_m_ + ((u64)((row0) + st_r_) * (K) + st_c_ * Tile::kKPerChunk) * Tile::kBytesNum; \
        else                                                                                         \
            (P).src = st_m_ + (u64)((row0) + st_r_) * ((K) / (Tile::kBytesDen / Tile::kBytesNum)) +  \
                      st_c_ * Tile::kChunk;                                                          \
        if (!Tile::kHoldStep)                                                                        \
            (P).step = 0;                                                                            \
        else if (Tile::kChunk == 4)                                                                  \
            (P).step = (u64)Tile::kRowStep * ((K) / Tile::kKPerChunk) * Tile::kRecord;               \
        else if (Tile::kBytesDen == 1)                                                               \
            (P).step = (u64)Tile::kRowStep * (K);                                                    \
        else                                                                                         \
            (P).step = (u64)Tile::kRowStep * ((K) / (Tile::kBytesDen / Tile::kBytesNum));            \
        if (Tile::kSwizzle)                                                                          \
            (P).off = (region) + st_r_ * Tile::kRowPitch + (st_c_ ^ (st_r_ % 8)) * Tile::kChunk;     \
        else if (Tile::kRowPitch == Tile::kChunksPerRow * Tile::kChunk)                              \
            (P).off = (region) + (st_r_ * Tile::kChunksPerRow + st_c_) * Tile::kChunk;               \
        else                                                                                         \
            (P).off = (region) + st_r_ * Tile::kRowPitch + st_c_ * Tile::kChunk;                     \
    } while (0)
