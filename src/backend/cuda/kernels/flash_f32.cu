// flash, f32 storage: FlashAttention-2 loop order on CUDA cores (FMA, exact f32; no TF32).
// One block per (32 query rows, batch * head), 128 threads: four lanes per query row, lane
// part p owning dims p, p + 4, p + 8, ... (so the four read consecutive banks); K/V tiles of
// 32 keys in shared memory; online softmax per row; causal tiles above the diagonal skipped.
// Defines: ELEM_KIND (0), HEAD_DIM (64 or 128). Work O(n_q n_kv d); shared memory
// 2 * 32 * HEAD_DIM * 4 bytes; no global workspace.
#if ELEM_KIND != 0
#error "flash_f32.cu is the f32 kernel: ELEM_KIND must be 0"
#endif
#if HEAD_DIM != 64 && HEAD_DIM != 128
#error "HEAD_DIM must be 64 or 128"
#endif

#define F_BM 32
#define F_BN 32
#define F_THREADS 128
#define DPT (HEAD_DIM / 4)

extern "C" __global__ void __launch_bounds__(F_THREADS)
    flash_fwd_f32(const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, float* __restrict__ o, int heads, int group,
                  int seq_q, int seq_kv, int causal, float scale_log2) {
    __shared__ __align__(16) float ks[F_BN * HEAD_DIM];
    __shared__ __align__(16) float vs[F_BN * HEAD_DIM];
    const long long bh = blockIdx.y;
    const long long b = bh / heads, h = bh % heads;
    const long long kv_heads = heads / group;
    const long long m0 = (long long)blockIdx.x * F_BM;
    const int part = threadIdx.x & 3;
    const long long row = m0 + (threadIdx.x >> 2);
    const float* kh = k + (b * kv_heads + h / group) * seq_kv * HEAD_DIM;
    const float* vh = v + (b * kv_heads + h / group) * seq_kv * HEAD_DIM;
    const bool live = row < seq_q;

    float qr[DPT], acc[DPT];
#pragma unroll
    for (int i = 0; i < DPT; ++i) {
        qr[i] = live ? q[(bh * seq_q + row) * HEAD_DIM + i * 4 + part] * scale_log2 : 0.0f;
        acc[i] = 0.0f;
    }
    const long long vis = live ? visible_keys(causal, row, seq_q, seq_kv) : 0;
    long long last = m0 + F_BM - 1 < seq_q ? m0 + F_BM - 1 : seq_q - 1;
    const long long n_end = visible_keys(causal, last, seq_q, seq_kv);
    float m_run = NEG_INF, l_run = 0.0f;

    for (long long key0 = 0; key0 < n_end; key0 += F_BN) {
        for (int c = threadIdx.x; c < F_BN * HEAD_DIM / 4; c += F_THREADS) {
            long long r = key0 + c / (HEAD_DIM / 4);
            int col = (c % (HEAD_DIM / 4)) * 4;
            float4 kz = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vz = kz;
            if (r < seq_kv) {
                kz = *(const float4*)(kh + r * HEAD_DIM + col);
                vz = *(const float4*)(vh + r * HEAD_DIM + col);
            }
            *(float4*)(ks + (c / (HEAD_DIM / 4)) * HEAD_DIM + col) = kz;
            *(float4*)(vs + (c / (HEAD_DIM / 4)) * HEAD_DIM + col) = vz;
        }
        __syncthreads();
        float s[F_BN];
        float mx = NEG_INF;
#pragma unroll
        for (int j = 0; j < F_BN; ++j) {
            float d = 0.0f;
#pragma unroll
            for (int i = 0; i < DPT; ++i) d = fmaf(qr[i], ks[j * HEAD_DIM + i * 4 + part], d);
            d += __shfl_xor_sync(0xffffffffu, d, 1);
            d += __shfl_xor_sync(0xffffffffu, d, 2);
            s[j] = key0 + j < vis ? d : NEG_INF;
            mx = fmaxf(mx, s[j]);
        }
        const float m_new = fmaxf(m_run, mx);
        const float base = m_new == NEG_INF ? 0.0f : m_new;
        const float alpha = exp2f(m_run - base);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < DPT; ++i) acc[i] *= alpha;
#pragma unroll
        for (int j = 0; j < F_BN; ++j) {
            const float p = exp2f(s[j] - base);
            sum += p;
#pragma unroll
            for (int i = 0; i < DPT; ++i) acc[i] = fmaf(p, vs[j * HEAD_DIM + i * 4 + part], acc[i]);
        }
        l_run = l_run * alpha + sum;
        m_run = m_new;
        __syncthreads();
    }
    if (live) {
        const float inv = l_run > 0.0f ? 1.0f / l_run : 0.0f;
#pragma unroll
        for (int i = 0; i < DPT; ++i) o[(bh * seq_q + row) * HEAD_DIM + i * 4 + part] = acc[i] * inv;
    }
}
