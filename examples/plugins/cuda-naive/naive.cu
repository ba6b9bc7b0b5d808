/*
 * cuda-naive: standard attention as an attnbench plugin, in CUDA (include/attnbench.h).
 * Three kernels on the case's stream: the scores S = scale * Q K^T with the mask (one thread
 * per score), a softmax per row (one thread per row), then O = P V (one thread per output
 * value). S is scratch from attnbench's allocator table, on the GPU: attnbench counts its
 * 4 * batch * heads * seq_q * seq_kv bytes exactly. A plain example, not a fast kernel.
 *
 * Build (on a machine with the CUDA toolkit):
 *   nvcc -O3 -shared -Xcompiler -fPIC -I include examples/plugins/cuda-naive/naive.cu \
 *        -o target/plugins/libcuda_naive.so
 * Use: [plugins] cuda-naive = "target/plugins/libcuda_naive.so", variant = ["flash",
 * "plugin:cuda-naive"], device = ["cuda"] (configs/gpu_your_kernel.toml; scripts/gpu_batch.sh
 * step `plugins`).
 *
 * Dtypes: f32, f16, bf16 (computed in f32). Layout and masks: the header.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "attnbench.h"

__device__ float load(const void *p, int dtype, long long i) {
    if (dtype == ATTNBENCH_F16) return __half2float(((const __half *)p)[i]);
    if (dtype == ATTNBENCH_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

__device__ void store(void *p, int dtype, long long i, float x) {
    if (dtype == ATTNBENCH_F16) ((__half *)p)[i] = __float2half(x);
    else if (dtype == ATTNBENCH_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16(x);
    else ((float *)p)[i] = x;
}

struct Dims {
    long long batch, heads, kv_heads, seq_q, seq_kv, head_dim, window;
    int causal, dtype;
    float scale;
    long long qs[4], ks[4], vs[4], os[4]; /* strides in elements */
};

/* Keys lo..hi query row i sees (the header's mask). */
__device__ void key_range(const Dims &d, long long i, long long *lo, long long *hi) {
    long long h = d.causal ? i + d.seq_kv - d.seq_q + 1 : d.seq_kv;
    h = h < 0 ? 0 : (h > d.seq_kv ? d.seq_kv : h);
    *hi = h;
    *lo = (d.window > 0 && h > d.window) ? h - d.window : 0;
}

/* s[b][h][i][j], one thread each; masked scores are -inf. */
__global__ void scores(Dims d, const void *q, const void *k, float *s) {
    long long n = d.batch * d.heads * d.seq_q * d.seq_kv;
    long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= n) return;
    long long j = t % d.seq_kv, i = (t / d.seq_kv) % d.seq_q;
    long long h = (t / (d.seq_kv * d.seq_q)) % d.heads, b = t / (d.seq_kv * d.seq_q * d.heads);
    long long lo, hi;
    key_range(d, i, &lo, &hi);
    if (j < lo || j >= hi) {
        s[t] = -INFINITY;
        return;
    }
    long long kh = h / (d.heads / d.kv_heads);
    long long qi = b * d.qs[0] + h * d.qs[1] + i * d.qs[2], kj = b * d.ks[0] + kh * d.ks[1] + j * d.ks[2];
    float acc = 0.0f;
    for (long long x = 0; x < d.head_dim; x++) acc += load(q, d.dtype, qi + x) * load(k, d.dtype, kj + x);
    s[t] = acc * d.scale;
}

/* Each row of s becomes softmax weights (all zeros for a row that sees no key). */
__global__ void softmax(Dims d, float *s) {
    long long rows = d.batch * d.heads * d.seq_q;
    long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float *p = s + r * d.seq_kv, max = -INFINITY, sum = 0.0f;
    for (long long j = 0; j < d.seq_kv; j++) max = fmaxf(max, p[j]);
    for (long long j = 0; j < d.seq_kv; j++) sum += (p[j] = max == -INFINITY ? 0.0f : expf(p[j] - max));
    for (long long j = 0; j < d.seq_kv; j++) p[j] = sum > 0.0f ? p[j] / sum : 0.0f;
}

/* o[b][h][i][x] = sum_j p[j] v[j][x], one thread each. */
__global__ void weighted(Dims d, const float *s, const void *v, void *o) {
    long long n = d.batch * d.heads * d.seq_q * d.head_dim;
    long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= n) return;
    long long x = t % d.head_dim, i = (t / d.head_dim) % d.seq_q;
    long long h = (t / (d.head_dim * d.seq_q)) % d.heads, b = t / (d.head_dim * d.seq_q * d.heads);
    long long kh = h / (d.heads / d.kv_heads);
    const float *p = s + ((b * d.heads + h) * d.seq_q + i) * d.seq_kv;
    float acc = 0.0f;
    for (long long j = 0; j < d.seq_kv; j++)
        acc += p[j] * load(v, d.dtype, b * d.vs[0] + kh * d.vs[1] + j * d.vs[2] + x);
    store(o, d.dtype, b * d.os[0] + h * d.os[1] + i * d.os[2] + x, acc);
}

static const char *error = NULL;

static const char *supports(const attnbench_case *c) {
    return c->device == ATTNBENCH_CUDA ? NULL : "cuda-naive runs on CUDA only";
}

static uint64_t workspace_bytes(const attnbench_case *c) {
    return (uint64_t)(c->batch * c->heads * c->seq_q * c->seq_kv) * sizeof(float);
}

static unsigned blocks(long long n) { return (unsigned)((n + 255) / 256); }

static int32_t forward(const attnbench_case *c, const attnbench_tensor *q,
                       const attnbench_tensor *k, const attnbench_tensor *v,
                       attnbench_tensor *o, const attnbench_allocator *scratch) {
    Dims d = {c->batch, c->heads, c->kv_heads, c->seq_q, c->seq_kv, c->head_dim, c->window,
              c->causal, c->dtype, c->scale, {0}, {0}, {0}, {0}};
    for (int x = 0; x < 4; x++) {
        d.qs[x] = q->strides[x];
        d.ks[x] = k->strides[x];
        d.vs[x] = v->strides[x];
        d.os[x] = o->strides[x];
    }
    float *s = (float *)scratch->alloc(scratch->ctx, workspace_bytes(c), 256);
    if (s == NULL) {
        error = "no device scratch for the score matrix";
        return 1;
    }
    cudaStream_t stream = (cudaStream_t)c->stream;
    long long rows = c->batch * c->heads * c->seq_q;
    scores<<<blocks(rows * c->seq_kv), 256, 0, stream>>>(d, q->data, k->data, s);
    softmax<<<blocks(rows), 256, 0, stream>>>(d, s);
    weighted<<<blocks(rows * c->head_dim), 256, 0, stream>>>(d, s, v->data, o->data);
    cudaError_t e = cudaGetLastError();
    /* attnbench frees device scratch with cuMemFree, which waits for the kernels using it. */
    scratch->free(scratch->ctx, s);
    if (e != cudaSuccess) {
        error = cudaGetErrorString(e);
        return 1;
    }
    return 0;
}

static const char *last_error(void) { return error; }

static const attnbench_plugin PLUGIN = {
    ATTNBENCH_ABI_VERSION, 0, "cuda-naive", supports, workspace_bytes, forward, last_error,
};

extern "C" const attnbench_plugin *attnbench_plugin_entry(void) { return &PLUGIN; }
