/*
 * c-naive: standard attention as an attnbench plugin, in C (include/attnbench.h).
 * Per query row: scores against every key it sees, the row max subtracted, softmax, then
 * the weighted sum of values. The score row is scratch taken through attnbench's allocator
 * table, so attnbench counts it exactly: seq_kv floats per call.
 *
 * Build:   cc -O2 -shared -fPIC -I include examples/plugins/c-naive/naive.c -o libc_naive.so
 * Use:     [plugins] c-naive = "libc_naive.so"   and   variant = ["flash", "plugin:c-naive"]
 *
 * Dtypes: f32 and bf16 (stored as bits; computed in f32). Layout and masks: the header.
 */
#include <math.h>
#include <string.h>

#include "attnbench.h"

static float load(const attnbench_tensor *t, int64_t i) {
    if (t->dtype == ATTNBENCH_BF16) {
        uint32_t bits = (uint32_t)((const uint16_t *)t->data)[i] << 16;
        float x;
        memcpy(&x, &bits, 4);
        return x;
    }
    return ((const float *)t->data)[i];
}

static void store(attnbench_tensor *t, int64_t i, float x) {
    if (t->dtype == ATTNBENCH_BF16) {
        uint32_t bits;
        memcpy(&bits, &x, 4);
        bits += 0x7FFF + ((bits >> 16) & 1); /* round to nearest even (finite values) */
        ((uint16_t *)t->data)[i] = (uint16_t)(bits >> 16);
    } else {
        ((float *)t->data)[i] = x;
    }
}

/* Element offset of [b][h][s][0] in t. */
static int64_t at(const attnbench_tensor *t, int64_t b, int64_t h, int64_t s) {
    return b * t->strides[0] + h * t->strides[1] + s * t->strides[2];
}

static const char *supports(const attnbench_case *c) {
    if (c->device != ATTNBENCH_CPU) return "c-naive runs on the CPU only";
    if (c->dtype == ATTNBENCH_F16) return "c-naive takes f32 and bf16, not f16";
    return NULL;
}

static uint64_t workspace_bytes(const attnbench_case *c) {
    return (uint64_t)c->seq_kv * sizeof(float);
}

static const char *error = NULL;

static int32_t forward(const attnbench_case *c, const attnbench_tensor *q,
                       const attnbench_tensor *k, const attnbench_tensor *v,
                       attnbench_tensor *o, const attnbench_allocator *scratch) {
    float *p = scratch->alloc(scratch->ctx, (size_t)c->seq_kv * sizeof(float), 64);
    if (p == NULL) {
        error = "no scratch for the score row";
        return 1;
    }
    const int64_t group = c->heads / c->kv_heads, shift = c->seq_kv - c->seq_q;
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t h = 0; h < c->heads; h++)
            for (int64_t i = 0; i < c->seq_q; i++) {
                /* Keys lo..hi this row sees (the header's mask). */
                int64_t hi = c->causal ? i + shift + 1 : c->seq_kv;
                hi = hi < 0 ? 0 : (hi > c->seq_kv ? c->seq_kv : hi);
                int64_t lo = (c->window > 0 && hi > c->window) ? hi - c->window : 0;
                const int64_t qi = at(q, b, h, i), oi = at(o, b, h, i);
                float max = -INFINITY, sum = 0.0f;
                for (int64_t j = lo; j < hi; j++) {
                    const int64_t kj = at(k, b, h / group, j);
                    float s = 0.0f;
                    for (int64_t d = 0; d < c->head_dim; d++) s += load(q, qi + d) * load(k, kj + d);
                    p[j] = s * c->scale;
                    max = p[j] > max ? p[j] : max;
                }
                for (int64_t j = lo; j < hi; j++) sum += (p[j] = expf(p[j] - max));
                for (int64_t d = 0; d < c->head_dim; d++) {
                    float acc = 0.0f;
                    for (int64_t j = lo; j < hi; j++) acc += p[j] * load(v, at(v, b, h / group, j) + d);
                    store(o, oi + d, hi > lo ? acc / sum : 0.0f);
                }
            }
    scratch->free(scratch->ctx, p);
    return 0;
}

static const char *last_error(void) { return error; }

static const attnbench_plugin PLUGIN = {
    ATTNBENCH_ABI_VERSION, 0, "c-naive", supports, workspace_bytes, forward, last_error,
};

const attnbench_plugin *attnbench_plugin_entry(void) { return &PLUGIN; }
