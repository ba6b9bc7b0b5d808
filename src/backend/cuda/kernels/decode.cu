// flash-decoding (Dao et al. 2023, "Flash-Decoding for long-context inference"): the KV cache
// is cut into `splits` parts; one block per (split, batch * kv_head, group of up to 8 query
// rows) computes its part's normalized output and logsumexp for every query head of the GQA
// group that shares the KV head (the cache is read once per group, not once per head);
// `decode_combine` merges the parts exactly: O = sum_s exp(lse_s - M) O_s / sum_s
// exp(lse_s - M). Causal (bottom-right) and sliding-window masks per row.
// Defines: ELEM_KIND, HEAD_DIM (64 or 128). Work O(b h n_q n_kv d); extra memory
// splits * b * h * n_q * (d + 1) floats.
//
// In a block each warp takes 32 keys at a time: lane = key for the scores (its own K row,
// q rows broadcast from shared memory), one warp max/sum per row, then lane = dims for P V
// (the V row read coalesced across the warp, probabilities broadcast by shuffles).
#if HEAD_DIM != 64 && HEAD_DIM != 128
#error "HEAD_DIM must be 64 or 128"
#endif

#define D_ROWS 8
#define D_WARPS 4
#define D_THREADS (D_WARPS * 32)
#define DPL (HEAD_DIM / 32)

// 8 consecutive elements of a row, widened to f32.
__device__ __forceinline__ void load8(const elem_t* p, float* out) {
#if ELEM_KIND == 0
    float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
#else
    uint4 u = *(const uint4*)p;
    u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = to_f32((elem_t)(w[i] & 0xffffu));
        out[2 * i + 1] = to_f32((elem_t)(w[i] >> 16));
    }
#endif
}

extern "C" __global__ void __launch_bounds__(D_THREADS)
    decode_split(const elem_t* __restrict__ q, const elem_t* __restrict__ k,
                 const elem_t* __restrict__ v, float* __restrict__ part_o,
                 float* __restrict__ part_lse, int batch, int heads, int group, int seq_q,
                 int seq_kv, int causal, int window, int keys_per_split, float scale_log2) {
    __shared__ float qs[D_ROWS][HEAD_DIM];
    __shared__ float wm[D_WARPS][D_ROWS], wl[D_WARPS][D_ROWS];
    __shared__ float wo[D_WARPS][D_ROWS][HEAD_DIM];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long split = blockIdx.x;
    const long long bkv = blockIdx.y;
    const long long kv_heads = heads / group;
    const long long b = bkv / kv_heads, kvh = bkv % kv_heads;
    const int rows_total = group * seq_q;
    const int r0 = blockIdx.z * D_ROWS;
    const elem_t* kh = k + bkv * seq_kv * HEAD_DIM;
    const elem_t* vh = v + bkv * seq_kv * HEAD_DIM;
    const long long start = split * keys_per_split;
    const long long end = start + keys_per_split < seq_kv ? start + keys_per_split : seq_kv;

    // Row r of the block: query head kvh * group + (r0 + r) / seq_q, query (r0 + r) % seq_q.
    int lo[D_ROWS], hi[D_ROWS];  // seq_kv < 2^31 (plan::unsupported)
#pragma unroll
    for (int r = 0; r < D_ROWS; ++r) {
        int rid = r0 + r;
        lo[r] = 0;
        hi[r] = 0;
        if (rid < rows_total) {
            long long i = rid % seq_q;
            hi[r] = (int)visible_keys(causal, i, seq_q, seq_kv);
            lo[r] = window > 0 && hi[r] > window ? hi[r] - window : 0;
        }
    }
    for (int c = threadIdx.x; c < D_ROWS * HEAD_DIM; c += D_THREADS) {
        int r = c / HEAD_DIM, d = c % HEAD_DIM, rid = r0 + r;
        float x = 0.0f;
        if (rid < rows_total) {
            long long h = kvh * group + rid / seq_q, i = rid % seq_q;
            x = to_f32(q[((b * heads + h) * seq_q + i) * HEAD_DIM + d]) * scale_log2;
        }
        qs[r][d] = x;
    }
    __syncthreads();

    float m_run[D_ROWS], l_run[D_ROWS], acc[D_ROWS][DPL];
#pragma unroll
    for (int r = 0; r < D_ROWS; ++r) {
        m_run[r] = NEG_INF;
        l_run[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[r][i] = 0.0f;
    }

    for (long long base = start + warp * 32; base < end; base += D_WARPS * 32) {
        const long long key = base + lane;
        float s[D_ROWS];
#pragma unroll
        for (int r = 0; r < D_ROWS; ++r) s[r] = 0.0f;
        if (key < end) {
            const elem_t* krow = kh + key * HEAD_DIM;
#pragma unroll 4
            for (int d0 = 0; d0 < HEAD_DIM; d0 += 8) {
                float kv8[8];
                load8(krow + d0, kv8);
#pragma unroll
                for (int r = 0; r < D_ROWS; ++r)
#pragma unroll
                    for (int i = 0; i < 8; ++i) s[r] = fmaf(qs[r][d0 + i], kv8[i], s[r]);
            }
        }
        float p[D_ROWS];
#pragma unroll
        for (int r = 0; r < D_ROWS; ++r) {
            const float x = key < end && key >= lo[r] && key < hi[r] ? s[r] : NEG_INF;
            const float m_new = fmaxf(m_run[r], warp_max(x));
            const float mb = m_new == NEG_INF ? 0.0f : m_new;
            const float alpha = exp2f(m_run[r] - mb);
            p[r] = exp2f(x - mb);
            l_run[r] = l_run[r] * alpha + warp_sum(p[r]);
            m_run[r] = m_new;
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[r][i] *= alpha;
        }
        const int n = end - base < 32 ? (int)(end - base) : 32;
        for (int j = 0; j < n; ++j) {
            const elem_t* vrow = vh + (base + j) * HEAD_DIM + lane * DPL;
            float vv[DPL];
#pragma unroll
            for (int i = 0; i < DPL; ++i) vv[i] = to_f32(vrow[i]);
#pragma unroll
            for (int r = 0; r < D_ROWS; ++r) {
                const float pj = __shfl_sync(0xffffffffu, p[r], j);
#pragma unroll
                for (int i = 0; i < DPL; ++i) acc[r][i] = fmaf(pj, vv[i], acc[r][i]);
            }
        }
    }

    // Merge the four warps, then write this split's normalized rows and logsumexp.
#pragma unroll
    for (int r = 0; r < D_ROWS; ++r) {
        if (lane == 0) {
            wm[warp][r] = m_run[r];
            wl[warp][r] = l_run[r];
        }
#pragma unroll
        for (int i = 0; i < DPL; ++i) wo[warp][r][lane * DPL + i] = acc[r][i];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < D_ROWS * HEAD_DIM; c += D_THREADS) {
        int r = c / HEAD_DIM, d = c % HEAD_DIM, rid = r0 + r;
        if (rid >= rows_total) continue;
        float big = NEG_INF;
        for (int w = 0; w < D_WARPS; ++w) big = fmaxf(big, wm[w][r]);
        float l = 0.0f, x = 0.0f;
        if (big != NEG_INF) {
            for (int w = 0; w < D_WARPS; ++w) {
                float f = exp2f(wm[w][r] - big);
                l += f * wl[w][r];
                x += f * wo[w][r][d];
            }
        }
        long long h = kvh * group + rid / seq_q, i = rid % seq_q;
        long long row = (split * batch * heads + b * heads + h) * seq_q + i;
        part_o[row * HEAD_DIM + d] = l > 0.0f ? x / l : 0.0f;
        if (d == 0) part_lse[row] = l > 0.0f ? (big + log2f(l)) * LN2 : NEG_INF;
    }
}

// One block of HEAD_DIM threads per output row (b, h, i): the exact logsumexp combine.
extern "C" __global__ void decode_combine(const float* __restrict__ part_o,
                                          const float* __restrict__ part_lse,
                                          float* __restrict__ o, long long rows, int splits) {
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        float big = NEG_INF;
        for (int s = 0; s < splits; ++s) big = fmaxf(big, part_lse[s * rows + row]);
        float den = 0.0f, x = 0.0f;
        if (big != NEG_INF) {
            for (int s = 0; s < splits; ++s) {
                float w = expf(part_lse[s * rows + row] - big);
                den += w;
                x += w * part_o[(s * rows + row) * HEAD_DIM + threadIdx.x];
            }
        }
        o[row * HEAD_DIM + threadIdx.x] = den > 0.0f ? x / den : 0.0f;
    }
}
