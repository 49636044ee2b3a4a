// stage_copy.cuh: global -> shared copies of one pipeline stage, for the
// prefill GEMMs whose CP_ASYNC define chooses the copy engine (gemm_dq.cu,
// mmq.cu). With CP_ASYNC = 1 the copies are cp.async to the shared address
// `dst` (zero-filled when !ok) and commit / wait_stages manage the groups;
// with CP_ASYNC = 0 they are plain loads and stores through the generic
// pointer `gdst`, and commit / wait_stages do nothing. The including file
// defines CP_ASYNC (checked there).
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
