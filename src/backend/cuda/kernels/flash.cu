// flash: FlashAttention-2 forward (Dao 2023, Algorithm 1 loop order) for bf16/f16 storage on
// tensor cores: one block per (64 query rows, batch * head), 4 warps of 16 rows each; the Q
// tile stays in registers as mma A fragments, K/V tiles of 64 keys are double-buffered in
// shared memory with cp.async, S = Q K^T and O += P V use mma.sync.m16n8k16 with f32
// accumulation, the softmax is online (running max and sum per row, one division at the
// end); causal blocks entirely above the diagonal are skipped. The inner loop is written for
// few instructions per mma (it is issue-bound with 2 to 3 warps per SM sub-partition): K and V
// fragments come by ldmatrix.x4 (one instruction per two mma), addresses are 32-bit shared
// offsets from one per-lane base, the scale is folded into the exponent (one FFMA per score)
// and exp2 is `ex2.approx.ftz` (one MUFU; results below 2^-126 flush to 0, far below the
// bf16/f16 resolution of P).
// Defines: ELEM_KIND (1 = bf16, 2 = f16), HEAD_DIM (64 or 128).
// Work O(n_q n_kv d); shared memory (64 + 4 * 64) * (HEAD_DIM + 8) * 2 bytes; no global
// workspace.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .bf16/.f16), for lane
// = 4 * g + t (g = groupID = lane / 4, t = threadID_in_group = lane % 4):
//   A (16x16, row-major): a0a1 = (g, 2t..2t+1), a2a3 = (g+8, 2t..), a4a5 = (g, 2t+8..),
//                         a6a7 = (g+8, 2t+8..); one 32-bit register per pair, lower index in
//                         the low half.
//   B (16x8, "col"):      b0b1 = (k = 2t..2t+1, n = g), b2b3 = (k = 2t+8.., n = g).
//   C/D (16x8, f32):      c0c1 = (g, 2t..2t+1), c2c3 = (g+8, 2t..2t+1).
#if ELEM_KIND == 1
#define MMA_AB "bf16"
#elif ELEM_KIND == 2
#define MMA_AB "f16"
#else
#error "flash.cu is the tensor-core kernel: ELEM_KIND must be 1 (bf16) or 2 (f16)"
#endif
#if HEAD_DIM != 64 && HEAD_DIM != 128
#error "HEAD_DIM must be 64 or 128"
#endif

#define BLOCK_M 64
#define BLOCK_N 64
#define NWARPS 4
#define NTHREADS (NWARPS * 32)
// Shared-memory row stride in elements: rows stay 16-byte aligned (cp.async, ldmatrix) and
// the 8-element pad moves consecutive rows to different banks.
#define STRIDE (HEAD_DIM + 8)
#define KSTEPS (HEAD_DIM / 16)
#define NTILES_S (BLOCK_N / 8)
#define NTILES_O (HEAD_DIM / 8)

__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_AB "." MMA_AB ".f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices: lanes 8m..8m+7 give the row addresses of matrix m; the lane receives
// (row g, columns 2t..2t+1) of each, i.e. the mma B fragment ("col") of a row-major
// [key][dim] tile read as K^T: matrices at dims +0, +8 of a 16-dim step are b0, b1.
__device__ __forceinline__ void ldmatrix_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// 2^x in one MUFU instruction (subnormal results flush to 0; -inf gives 0).
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Four 8x8 b16 matrices, transposed: lanes 8m..8m+7 give the row addresses of matrix m; the
// lane receives (row 2t + i, column g) of each, i.e. the mma B fragment of a row-major
// [key][dim] tile.
__device__ __forceinline__ void ldmatrix_x4_trans(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// rows [row0, row0 + 64) of a [rows][HEAD_DIM] head into a shared tile; rows past `nrows`
// are zero-filled (a zero V row times a zero probability stays 0, never NaN).
__device__ __forceinline__ void load_tile(elem_t* tile, const elem_t* head, long long row0,
                                          long long nrows) {
    const int chunks = HEAD_DIM / 8;
    for (int c = threadIdx.x; c < 64 * chunks; c += NTHREADS) {
        int row = c / chunks, col = (c % chunks) * 8;
        bool valid = row0 + row < nrows;
        const elem_t* src = head + (valid ? row0 + row : 0) * HEAD_DIM + col;
        cp_async16(tile + row * STRIDE + col, src, valid);
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
    flash_fwd(const elem_t* __restrict__ q, const elem_t* __restrict__ k,
              const elem_t* __restrict__ v, float* __restrict__ o, int heads, int group,
              int seq_q, int seq_kv, int causal, float scale_log2) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    elem_t* qs = (elem_t*)smem_raw;
    // K buffers at rows BLOCK_M + i * BLOCK_N, V buffers after them (computed, not an array
    // of pointers, which would live on the stack when indexed by the loop).
    elem_t* const k_smem = qs + BLOCK_M * STRIDE;
    elem_t* const v_smem = qs + (BLOCK_M + 2 * BLOCK_N) * STRIDE;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const long long bh = blockIdx.y;
    const long long b = bh / heads, h = bh % heads;
    const long long kv_heads = heads / group;
    const long long m0 = (long long)blockIdx.x * BLOCK_M;
    const elem_t* qh = q + bh * seq_q * HEAD_DIM;
    const elem_t* kh = k + (b * kv_heads + h / group) * seq_kv * HEAD_DIM;
    const elem_t* vh = v + (b * kv_heads + h / group) * seq_kv * HEAD_DIM;
    float* oh = o + bh * seq_q * HEAD_DIM;

    // Keys any row of the block sees (the last row sees the most), and keys every row sees
    // (the first row sees the fewest): only tiles past the latter need the mask.
    long long last = m0 + BLOCK_M - 1 < seq_q ? m0 + BLOCK_M - 1 : seq_q - 1;
    const long long n_end = visible_keys(causal, last, seq_q, seq_kv);
    const long long n_all = visible_keys(causal, m0, seq_q, seq_kv);
    const int n_tiles = (int)((n_end + BLOCK_N - 1) / BLOCK_N);

    const long long row0 = m0 + warp * 16 + g, row1 = row0 + 8;
    const long long vis0 = visible_keys(causal, row0, seq_q, seq_kv);
    const long long vis1 = visible_keys(causal, row1, seq_q, seq_kv);

    float acc[NTILES_O][4];
#pragma unroll
    for (int i = 0; i < NTILES_O; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float m_run[2] = {NEG_INF, NEG_INF};  // running max of the raw (unscaled) scores
    float l_run[2] = {0.0f, 0.0f};  // this thread's partial row sums (reduced at the end)
    u32 qa[KSTEPS][4];
    // Per-lane byte offsets into shared memory: the K rows this lane names for ldmatrix
    // (row lane % 8 of matrix lane / 8, the matrices 8 dims apart) and the V rows for
    // ldmatrix.trans (matrix m: keys + (m & 1) * 8, dims + (m >> 1) * 8).
    const int mat = lane >> 3, mr = lane & 7;
    const u32 k_lane = smem_u32(k_smem) + (u32)(mr * STRIDE + mat * 8) * 2;
    const u32 v_lane = smem_u32(v_smem) + (u32)(((mat & 1) * 8 + mr) * STRIDE + (mat >> 1) * 8) * 2;

    if (n_tiles > 0) {
        load_tile(qs, qh, m0, seq_q);
        load_tile(k_smem, kh, 0, seq_kv);
        load_tile(v_smem, vh, 0, seq_kv);
        cp_async_commit();
    }
    for (int tile = 0; tile < n_tiles; ++tile) {
        const int cur = tile & 1;
        if (tile + 1 < n_tiles) {
            // The buffer `cur ^ 1` was last read in iteration tile - 1, which ended with a
            // barrier, so it is free.
            load_tile(k_smem + (cur ^ 1) * BLOCK_N * STRIDE, kh, (long long)(tile + 1) * BLOCK_N, seq_kv);
            load_tile(v_smem + (cur ^ 1) * BLOCK_N * STRIDE, vh, (long long)(tile + 1) * BLOCK_N, seq_kv);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (tile == 0) {
            const elem_t* qw = qs + (warp * 16) * STRIDE;
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                qa[kk][0] = *(const u32*)(qw + g * STRIDE + kk * 16 + 2 * t);
                qa[kk][1] = *(const u32*)(qw + (g + 8) * STRIDE + kk * 16 + 2 * t);
                qa[kk][2] = *(const u32*)(qw + g * STRIDE + kk * 16 + 8 + 2 * t);
                qa[kk][3] = *(const u32*)(qw + (g + 8) * STRIDE + kk * 16 + 8 + 2 * t);
            }
        }

        // S = Q K^T for this warp's 16 rows and the tile's 64 keys (raw scores): one
        // ldmatrix.x4 gives the B fragments of two 16-dim steps of one 8-key n-tile.
        float s[NTILES_S][4];
        const u32 k_tile = k_lane + (u32)(cur * BLOCK_N * STRIDE) * 2;
#pragma unroll
        for (int nt = 0; nt < NTILES_S; ++nt) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk += 2) {
                u32 kb[4];
                ldmatrix_x4(kb, k_tile + (u32)(nt * 8 * STRIDE + kk * 16) * 2);
                mma16816(s[nt], qa[kk], kb[0], kb[1]);
                mma16816(s[nt], qa[kk + 1], kb[2], kb[3]);
            }
        }

        // Mask keys past each row's causal bound (or past seq_kv); only tiles that reach
        // past the keys every row sees.
        const long long key0 = (long long)tile * BLOCK_N;
        if (key0 + BLOCK_N > n_all) {
#pragma unroll
            for (int nt = 0; nt < NTILES_S; ++nt) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    long long key = key0 + nt * 8 + 2 * t + (i & 1);
                    if (key >= (i < 2 ? vis0 : vis1)) s[nt][i] = NEG_INF;
                }
            }
        }

        // Online softmax, rows g (r = 0: c0, c1) and g + 8 (r = 1: c2, c3). The four lanes
        // of a quad hold one row's 64 scores. The max is taken on raw scores (the scale is
        // positive), the exponent is scale_log2 * s - scale_log2 * max in one FFMA.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = NEG_INF;
#pragma unroll
            for (int nt = 0; nt < NTILES_S; ++nt)
                mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_run[r], mx);
            const float base = m_new == NEG_INF ? 0.0f : m_new * scale_log2;
            const float alpha = ex2_ftz(m_run[r] * scale_log2 - base);
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NTILES_S; ++nt) {
                float p0 = ex2_ftz(fmaf(s[nt][2 * r], scale_log2, -base));
                float p1 = ex2_ftz(fmaf(s[nt][2 * r + 1], scale_log2, -base));
                s[nt][2 * r] = p0;
                s[nt][2 * r + 1] = p1;
                sum += p0 + p1;
            }
            l_run[r] = l_run[r] * alpha + sum;
            m_run[r] = m_new;
#pragma unroll
            for (int dt = 0; dt < NTILES_O; ++dt) {
                acc[dt][2 * r] *= alpha;
                acc[dt][2 * r + 1] *= alpha;
            }
        }

        // O += P V: the C fragments of S n-tiles 2j and 2j + 1 are exactly the A fragment of
        // P's 16-key step j (FlashAttention-2's register reuse), rounded to the storage dtype.
        const u32 v_tile = v_lane + (u32)(cur * BLOCK_N * STRIDE) * 2;
#pragma unroll
        for (int j = 0; j < BLOCK_N / 16; ++j) {
            u32 pa[4];
            pa[0] = pack2(s[2 * j][0], s[2 * j][1]);
            pa[1] = pack2(s[2 * j][2], s[2 * j][3]);
            pa[2] = pack2(s[2 * j + 1][0], s[2 * j + 1][1]);
            pa[3] = pack2(s[2 * j + 1][2], s[2 * j + 1][3]);
#pragma unroll
            for (int dt = 0; dt < NTILES_O; dt += 2) {
                u32 vb[4];
                ldmatrix_x4_trans(vb, v_tile + (u32)(j * 16 * STRIDE + dt * 8) * 2);
                mma16816(acc[dt], pa, vb[0], vb[1]);
                mma16816(acc[dt + 1], pa, vb[2], vb[3]);
            }
        }
        __syncthreads();
    }

    // Finish: the row sums over the quad, one division, rows that saw no key write 0.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
    const float inv0 = l_run[0] > 0.0f ? 1.0f / l_run[0] : 0.0f;
    const float inv1 = l_run[1] > 0.0f ? 1.0f / l_run[1] : 0.0f;
#pragma unroll
    for (int dt = 0; dt < NTILES_O; ++dt) {
        const int col = dt * 8 + 2 * t;
        if (row0 < seq_q)
            *(float2*)(oh + row0 * HEAD_DIM + col) = make_float2(acc[dt][0] * inv0, acc[dt][1] * inv0);
        if (row1 < seq_q)
            *(float2*)(oh + row1 * HEAD_DIM + col) = make_float2(acc[dt][2] * inv1, acc[dt][3] * inv1);
    }
}
