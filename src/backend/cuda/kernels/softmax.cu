// naive: row softmax of S = scale * Q K^T (cuBLAS wrote it, f32), in place, producing P in
// the storage dtype for the P V GEMM. Defines: ELEM_KIND, SAFE (1 = subtract the row max,
// 0 = naive-unsafe: exp of the raw scores, which overflows once they reach about 89).
//
// Layout: `rows` rows of `seq_kv` f32 scores; row r is query r % seq_q of its head (heads of
// one GQA group are consecutive, so the row index modulo seq_q is the query index). P row r
// is written over the same bytes: for a 16-bit dtype its elements are 2 bytes apart inside
// the 4 * seq_kv bytes of the row, so the P V GEMM reads it with ld = 2 * seq_kv.
#ifndef SAFE
#error "SAFE must be defined (1 = max subtraction, 0 = none)"
#endif

extern "C" __global__ void softmax_rows(float* s, long long rows, int seq_q, int seq_kv,
                                        int causal) {
    __shared__ float red[32];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        float* srow = s + row * (long long)seq_kv;
        elem_t* prow = (elem_t*)srow;
        long long vis = visible_keys(causal, row % seq_q, seq_q, seq_kv);
#if SAFE
        float m = NEG_INF;
        for (long long j = threadIdx.x; j < vis; j += blockDim.x) m = fmaxf(m, srow[j]);
        m = block_max(m, red);
        if (m == NEG_INF) m = 0.0f;
#else
        float m = 0.0f;
#endif
        float l = 0.0f;
        for (long long j = threadIdx.x; j < vis; j += blockDim.x) l += expf(srow[j] - m);
        l = block_sum(l, red);
        float inv = vis > 0 ? 1.0f / l : 0.0f;
        // Chunk by chunk: every thread reads its score, the block synchronizes, then writes.
        // A 16-bit P element j lands in f32 element j / 2 <= j, which this or an earlier
        // chunk has already read; later chunks read only elements beyond this chunk.
        for (long long base = 0; base < seq_kv; base += blockDim.x) {
            long long j = base + threadIdx.x;
            float p = 0.0f;
            if (j < vis) p = expf(srow[j] - m) * inv;
            __syncthreads();
            if (j < seq_kv) prow[j] = from_f32(p);
        }
        __syncthreads();
    }
}
