// rabe-staats: Rabe & Staats (2021) Figure 1 on the GPU. For one query chunk, cuBLAS writes
// S = scale * Q_c K_j^T for every key chunk j; `chunk_summary` turns each row of S into the
// chunk's summary (row max m_j, E = exp(S - m_j) in place, l_j = rowsum E); cuBLAS then writes
// v_j = E V_j; `chunk_combine` rescales the summaries to the global max and divides.
// Defines: ELEM_KIND. Work O(n_q n_kv d), extra memory b h q_c (k_c + n_kv/k_c (d + 2)) floats.
//
// Layouts (bh = b * heads + h, rows r of the query chunk, key chunk jc of n_chunks):
//   s:  [bh][q_chunk][k_chunk] f32 (row stride k_chunk; E overwrites it with stride 2 k_chunk
//       elements for 16-bit dtypes, see softmax.cu)
//   ms, ls: [bh][n_chunks][q_chunk] f32;  vs: [bh][n_chunks][q_chunk][head_dim] f32

extern "C" __global__ void chunk_summary(float* s, float* ms, float* ls, int q_chunk,
                                         int k_chunk, int q_rows, int k_cols, int q0, int k0,
                                         int jc, int n_chunks, int seq_q, int seq_kv,
                                         int causal) {
    __shared__ float red[32];
    int r = blockIdx.x;
    long long bh = blockIdx.y;
    if (r >= q_rows) return;
    float* srow = s + (bh * q_chunk + r) * (long long)k_chunk;
    elem_t* erow = (elem_t*)srow;
    long long vis = visible_keys(causal, q0 + r, seq_q, seq_kv) - k0;
    int cols = vis < 0 ? 0 : (vis > k_cols ? k_cols : (int)vis);
    float m = NEG_INF;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, srow[j]);
    m = block_max(m, red);
    float base = m == NEG_INF ? 0.0f : m;
    float l = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) l += expf(srow[j] - base);
    l = block_sum(l, red);
    for (int b0 = 0; b0 < k_cols; b0 += blockDim.x) {
        int j = b0 + threadIdx.x;
        float e = 0.0f;
        if (j < cols) e = expf(srow[j] - base);
        __syncthreads();
        if (j < k_cols) erow[j] = from_f32(e);
    }
    if (threadIdx.x == 0) {
        long long at = (bh * n_chunks + jc) * q_chunk + r;
        ms[at] = m;
        ls[at] = l;
    }
}

// O rows of the query chunk: sum_j exp(m_j - M) v_j / sum_j exp(m_j - M) l_j, M = max_j m_j,
// over the first `used` key chunks (the rest are entirely above the causal diagonal).
extern "C" __global__ void chunk_combine(const float* ms, const float* ls, const float* vs,
                                         float* o, int q_chunk, int q_rows, int q0, int used,
                                         int n_chunks, int seq_q, int head_dim) {
    int r = blockIdx.x;
    long long bh = blockIdx.y;
    if (r >= q_rows) return;
    const float* m = ms + bh * n_chunks * (long long)q_chunk + r;
    const float* l = ls + bh * n_chunks * (long long)q_chunk + r;
    float big = NEG_INF;
    for (int j = 0; j < used; ++j) big = fmaxf(big, m[(long long)j * q_chunk]);
    float den = 0.0f;
    if (big != NEG_INF)
        for (int j = 0; j < used; ++j) den += expf(m[(long long)j * q_chunk] - big) * l[(long long)j * q_chunk];
    float inv = den > 0.0f ? 1.0f / den : 0.0f;
    float* orow = o + (bh * seq_q + q0 + r) * (long long)head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        if (big != NEG_INF) {
            for (int j = 0; j < used; ++j) {
                float w = expf(m[(long long)j * q_chunk] - big);
                acc += w * vs[((bh * n_chunks + j) * q_chunk + r) * (long long)head_dim + d];
            }
        }
        orow[d] = acc * inv;
    }
}
