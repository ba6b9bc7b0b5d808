// flash-decoding (Dao et al. 2023, "Flash-Decoding for long-context inference"): the KV cache
// is cut into `splits` parts; one block per (split, batch * kv_head, group of D_ROWS query
// rows) computes its part's normalized output and logsumexp for every query head of the GQA
// group that shares the KV head (the cache is read once per group, not once per head);
// `decode_combine` merges the parts exactly: O = sum_s exp(lse_s - M) O_s / sum_s
// exp(lse_s - M). Causal (bottom-right) and sliding-window masks per row.
// Defines: ELEM_KIND, HEAD_DIM (64 or 128), D_ROWS (query rows per block: 1, 2, 4 or 8).
// Work O(b h n_q n_kv d); extra memory splits * b * h * n_q * (d + 1) floats.
//
// Decode reads the cache once and does little arithmetic per byte, so the split pass is built
// to keep many bytes in flight: the block's 128 threads copy tiles of TILE keys of K and V
// into shared memory with cp.async (coalesced 16-byte pieces, STAGES buffers: tile t + 1 is
// on its way while tile t is computed), and only the keys the block's rows can see are read.
// Each warp takes 16 keys of a tile: for the scores, lane = key (lane & 15) and half of the
// head dims (lane >> 4), one shuffle adds the halves; a 16-lane max per row updates the
// running max; for P V, lane = HEAD_DIM / 32 consecutive dims, the probabilities broadcast
// by shuffles. The four warps' (max, sum, output) are merged at the end.
#if HEAD_DIM != 64 && HEAD_DIM != 128
#error "HEAD_DIM must be 64 or 128"
#endif
#if D_ROWS != 1 && D_ROWS != 2 && D_ROWS != 4 && D_ROWS != 8
#error "D_ROWS must be 1, 2, 4 or 8"
#endif

#define D_WARPS 4
#define D_THREADS (D_WARPS * 32)
#define TILE 64                    // keys per shared-memory stage (16 per warp)
#define STAGES 2
#if ELEM_KIND == 0
#define ESZ 4                      // bytes per stored element
#else
#define ESZ 2
#endif
#define CH (16 / ESZ)              // elements in one 16-byte piece
#define ROW_CHUNKS (HEAD_DIM / CH)  // 16-byte pieces in one row
#define HALF_CHUNKS (ROW_CHUNKS / 2)
#define K_PITCH (HEAD_DIM + CH)    // K rows padded by 16 bytes: lanes reading 8 rows hit 8 bank groups
#define DPL (HEAD_DIM / 32)        // dims per lane in P V
#define K_TILE_BYTES (TILE * K_PITCH * ESZ)
#define V_TILE_BYTES (TILE * HEAD_DIM * ESZ)
#define STAGE_BYTES (K_TILE_BYTES + V_TILE_BYTES)
#define QS_BYTES (D_ROWS * HEAD_DIM * 4)
// Dynamic shared memory the split pass needs (plan::decode_shared_bytes computes the same).
#define DECODE_SHARED_BYTES (QS_BYTES + STAGES * STAGE_BYTES)
// The warps' partial results are merged in the stage buffers once the loop is done.
#define MERGE_BYTES ((2 * D_WARPS * D_ROWS + D_WARPS * D_ROWS * HEAD_DIM) * 4)
#if MERGE_BYTES > STAGES * STAGE_BYTES
#error "the merge area must fit in the stage buffers"
#endif

// One 16-byte piece of a row (CH elements) from shared memory, widened to f32.
__device__ __forceinline__ void load_piece(const elem_t* p, float* out) {
#if ELEM_KIND == 0
    float4 a = *(const float4*)p;
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
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

// DPL consecutive elements (a lane's share of a V row) from shared memory, widened to f32.
__device__ __forceinline__ void load_lane_dims(const elem_t* p, float* out) {
#if ELEM_KIND == 0
#if DPL == 4
    float4 a = *(const float4*)p;
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
#else
    float2 a = *(const float2*)p;
    out[0] = a.x; out[1] = a.y;
#endif
#else
#if DPL == 4
    uint2 u = *(const uint2*)p;
    out[0] = to_f32((elem_t)(u.x & 0xffffu));
    out[1] = to_f32((elem_t)(u.x >> 16));
    out[2] = to_f32((elem_t)(u.y & 0xffffu));
    out[3] = to_f32((elem_t)(u.y >> 16));
#else
    u32 u = *(const u32*)p;
    out[0] = to_f32((elem_t)(u & 0xffffu));
    out[1] = to_f32((elem_t)(u >> 16));
#endif
#endif
}

// Keys [key0, key0 + TILE) of one KV head into a stage (K rows padded, V rows dense); keys
// at or past `end` are zero-filled (never read past the cache).
__device__ __forceinline__ void load_kv_tile(unsigned char* stage, const elem_t* kh,
                                             const elem_t* vh, long long key0, long long end) {
    elem_t* ks = (elem_t*)stage;
    elem_t* vs = (elem_t*)(stage + K_TILE_BYTES);
    for (int c = threadIdx.x; c < TILE * ROW_CHUNKS; c += D_THREADS) {
        const int row = c / ROW_CHUNKS, col = (c % ROW_CHUNKS) * CH;
        const long long key = key0 + row;
        const bool valid = key < end;
        const long long off = (valid ? key : 0) * HEAD_DIM + col;
        cp_async16(ks + row * K_PITCH + col, kh + off, valid);
        cp_async16(vs + row * HEAD_DIM + col, vh + off, valid);
    }
}

__device__ __forceinline__ u32 dynamic_smem_size() {
    u32 r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}

extern "C" __global__ void __launch_bounds__(D_THREADS)
    decode_split(const elem_t* __restrict__ q, const elem_t* __restrict__ k,
                 const elem_t* __restrict__ v, float* __restrict__ part_o,
                 float* __restrict__ part_lse, int batch, int heads, int group, int seq_q,
                 int seq_kv, int causal, int window, int keys_per_split, float scale_log2) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // A launch with less shared memory than this build's layout is a planning bug: stop it
    // loudly instead of writing past the allocation.
    if (dynamic_smem_size() < DECODE_SHARED_BYTES) asm volatile("trap;");
    float* qs = (float*)smem_raw;
    unsigned char* stages = smem_raw + QS_BYTES;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kk = lane & 15, hf = lane >> 4;
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
    // Keys [lo, hi) are visible to it; the block reads only the union over its rows.
    int lo[D_ROWS], hi[D_ROWS];  // seq_kv < 2^31 (plan::unsupported)
    long long lo_min = seq_kv, hi_max = 0;
#pragma unroll
    for (int r = 0; r < D_ROWS; ++r) {
        const int rid = r0 + r;
        lo[r] = 0;
        hi[r] = 0;
        if (rid < rows_total) {
            const long long i = rid % seq_q;
            hi[r] = (int)visible_keys(causal, i, seq_q, seq_kv);
            lo[r] = window > 0 && hi[r] > window ? hi[r] - window : 0;
            if (hi[r] > lo[r]) {
                lo_min = lo[r] < lo_min ? lo[r] : lo_min;
                hi_max = hi[r] > hi_max ? hi[r] : hi_max;
            }
        }
    }
    const long long first = start > lo_min ? start : lo_min;
    const long long last = end < hi_max ? end : hi_max;
    const int ntiles = last > first ? (int)((last - first + TILE - 1) / TILE) : 0;

    // Start the first tiles' copies, then load the queries (pre-scaled into log2 units).
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < ntiles) load_kv_tile(stages + t * STAGE_BYTES, kh, vh, first + (long long)t * TILE, last);
        cp_async_commit();
    }
    for (int c = threadIdx.x; c < D_ROWS * HEAD_DIM; c += D_THREADS) {
        const int r = c / HEAD_DIM, d = c % HEAD_DIM, rid = r0 + r;
        float x = 0.0f;
        if (rid < rows_total) {
            const long long h = kvh * group + rid / seq_q, i = rid % seq_q;
            x = to_f32(q[((b * heads + h) * seq_q + i) * HEAD_DIM + d]) * scale_log2;
        }
        qs[c] = x;
    }

    float m_run[D_ROWS], l_part[D_ROWS], acc[D_ROWS][DPL];
#pragma unroll
    for (int r = 0; r < D_ROWS; ++r) {
        m_run[r] = NEG_INF;
        l_part[r] = 0.0f;  // this lane's share of the row sum (keys of half 0 only)
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[r][i] = 0.0f;
    }

    for (int t = 0; t < ntiles; ++t) {
        // Tile t has landed (this thread's copies), and after the barrier everyone's; the
        // barrier also ends every warp's reads of tile t - 1, whose buffer is refilled next.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        {
            const int nt = t + STAGES - 1;
            if (nt < ntiles)
                load_kv_tile(stages + (nt % STAGES) * STAGE_BYTES, kh, vh, first + (long long)nt * TILE, last);
            cp_async_commit();
        }
        const unsigned char* stage = stages + (t % STAGES) * STAGE_BYTES;
        const elem_t* ks = (const elem_t*)stage;
        const elem_t* vs = (const elem_t*)(stage + K_TILE_BYTES);
        const long long key = first + (long long)t * TILE + warp * 16 + kk;

        // Scores of key `key` over this lane's half of the dims, then the halves added.
        float s[D_ROWS];
#pragma unroll
        for (int r = 0; r < D_ROWS; ++r) s[r] = 0.0f;
        const elem_t* krow = ks + (warp * 16 + kk) * K_PITCH + hf * (HEAD_DIM / 2);
        const float* qh = qs + hf * (HEAD_DIM / 2);
#pragma unroll
        for (int c = 0; c < HALF_CHUNKS; ++c) {
            float kv[CH];
            load_piece(krow + c * CH, kv);
#pragma unroll
            for (int r = 0; r < D_ROWS; ++r) {
#pragma unroll
                for (int i = 0; i < CH; i += 4) {
                    const float4 qv = *(const float4*)(qh + r * HEAD_DIM + c * CH + i);
                    s[r] = fmaf(qv.x, kv[i], s[r]);
                    s[r] = fmaf(qv.y, kv[i + 1], s[r]);
                    s[r] = fmaf(qv.z, kv[i + 2], s[r]);
                    s[r] = fmaf(qv.w, kv[i + 3], s[r]);
                }
            }
        }

        // Online softmax: lanes l and l ^ 16 hold the same (bitwise) scores, so the 16-lane
        // max and hence m_run are the same on every lane of the warp.
        float p[D_ROWS];
#pragma unroll
        for (int r = 0; r < D_ROWS; ++r) {
            s[r] += __shfl_xor_sync(0xffffffffu, s[r], 16);
            const float x = key < last && key >= lo[r] && key < hi[r] ? s[r] : NEG_INF;
            float mx = x;
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_new = fmaxf(m_run[r], mx);
            const float mb = m_new == NEG_INF ? 0.0f : m_new;
            const float alpha = exp2f(m_run[r] - mb);
            p[r] = exp2f(x - mb);
            l_part[r] = l_part[r] * alpha + (hf == 0 ? p[r] : 0.0f);
            m_run[r] = m_new;
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[r][i] *= alpha;
        }

        // O += P V over the warp's 16 keys; lane j holds key j's probabilities.
        const elem_t* vw = vs + (warp * 16) * HEAD_DIM + lane * DPL;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            float vv[DPL];
            load_lane_dims(vw + j * HEAD_DIM, vv);
#pragma unroll
            for (int r = 0; r < D_ROWS; ++r) {
                const float pj = __shfl_sync(0xffffffffu, p[r], j);
#pragma unroll
                for (int i = 0; i < DPL; ++i) acc[r][i] = fmaf(pj, vv[i], acc[r][i]);
            }
        }
    }

    // Merge the four warps in the (now idle) stage buffers, then write this split's
    // normalized rows and logsumexp.
    cp_async_wait<0>();
    __syncthreads();
    float* wm = (float*)stages;
    float* wl = wm + D_WARPS * D_ROWS;
    float* wo = wl + D_WARPS * D_ROWS;  // [D_WARPS][D_ROWS][HEAD_DIM]
#pragma unroll
    for (int r = 0; r < D_ROWS; ++r) {
        const float l = warp_sum(l_part[r]);
        if (lane == 0) {
            wm[warp * D_ROWS + r] = m_run[r];
            wl[warp * D_ROWS + r] = l;
        }
#pragma unroll
        for (int i = 0; i < DPL; ++i) wo[(warp * D_ROWS + r) * HEAD_DIM + lane * DPL + i] = acc[r][i];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < D_ROWS * HEAD_DIM; c += D_THREADS) {
        const int r = c / HEAD_DIM, d = c % HEAD_DIM, rid = r0 + r;
        if (rid >= rows_total) continue;
        float big = NEG_INF;
        for (int w = 0; w < D_WARPS; ++w) big = fmaxf(big, wm[w * D_ROWS + r]);
        float l = 0.0f, x = 0.0f;
        if (big != NEG_INF) {
            for (int w = 0; w < D_WARPS; ++w) {
                const float f = exp2f(wm[w * D_ROWS + r] - big);
                l += f * wl[w * D_ROWS + r];
                x += f * wo[(w * D_ROWS + r) * HEAD_DIM + d];
            }
        }
        const long long h = kvh * group + rid / seq_q, i = rid % seq_q;
        const long long row = (split * batch * heads + b * heads + h) * seq_q + i;
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
