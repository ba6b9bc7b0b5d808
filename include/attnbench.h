/*
 * attnbench.h: the C ABI of an attention plugin that attnbench measures (ABI version 1).
 *
 * A plugin is a shared library that exports one function, attnbench_plugin_entry, returning
 * a static table (attnbench_plugin). attnbench loads it in a worker process of its own
 * (`attnbench worker --plugin LIB`), checks abi_version before it calls anything else,
 * asks supports() for every case, then times forward() calls and checks one output
 * against its float64 oracle. Guide: docs/guide/your-kernel.md. Examples:
 * examples/plugins/ (C, Rust, CUDA).
 *
 * Layout: every tensor is 4-dimensional, with strides in elements (attnbench passes C
 * order). q and o are [batch, heads, seq_q, head_dim]; k and v are
 * [batch, kv_heads, seq_kv, head_dim]. Query head h reads key/value head
 * h / (heads / kv_heads) (grouped-query attention; MQA when kv_heads == 1).
 *
 * Math: o = softmax(scale * q k^T + mask) v, rows over keys, with
 *   causal: query row i (0-based) attends key j only if j <= i + (seq_kv - seq_q), the
 *           mask aligned to the bottom right (a query is the last of its sequence: decode
 *           and chunked prefill);
 *   window: w > 0 keeps only the last w keys a row would see: with causal,
 *           i + (seq_kv - seq_q) - w < j <= i + (seq_kv - seq_q); without, j >= seq_kv - w.
 *           0 means none.
 * A row that sees no key (causal with seq_q > seq_kv) is all zeros.
 * f16 and bf16 tensors hold IEEE half and bfloat16 bits; o has q's dtype.
 */
#ifndef ATTNBENCH_H
#define ATTNBENCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version this header describes. attnbench refuses a plugin whose table says another. */
#define ATTNBENCH_ABI_VERSION 1u

enum attnbench_dtype { ATTNBENCH_F32 = 0, ATTNBENCH_F16 = 1, ATTNBENCH_BF16 = 2 };
enum attnbench_device { ATTNBENCH_CPU = 0, ATTNBENCH_CUDA = 1 };
enum attnbench_mode { ATTNBENCH_FWD = 0, ATTNBENCH_DECODE = 1 };

typedef struct attnbench_tensor {
    void *data;         /* host memory for CPU cases, device memory for CUDA cases */
    int32_t dtype;      /* enum attnbench_dtype */
    int32_t ndim;       /* 4 */
    int64_t shape[4];
    int64_t strides[4]; /* in elements */
} attnbench_tensor;

typedef struct attnbench_case {
    int64_t batch, heads, kv_heads, seq_q, seq_kv, head_dim;
    int32_t dtype;   /* enum attnbench_dtype, of q, k, v and o */
    int32_t device;  /* enum attnbench_device */
    int32_t mode;    /* enum attnbench_mode: decode is a forward with a few queries */
    int32_t causal;  /* 0 or 1, see the mask above */
    int64_t window;  /* 0: none */
    float scale;     /* 1 / sqrt(head_dim) */
    int32_t threads; /* CPU threads the case may use */
    void *stream;    /* the cudaStream_t of a CUDA case (NULL: the default stream); NULL on the CPU */
} attnbench_case;

/*
 * Scratch memory. Allocate every temporary buffer of forward() through this table and
 * attnbench counts its bytes exactly, as it counts its own kernels' (the row's memory
 * overhead beyond inputs and output). alloc returns NULL when a request of 1 MiB or more
 * does not fit the run's memory budget (the inputs and output count against it): return an
 * error then, the row says oom. Free every block before forward() returns: scratch still
 * held then fails the case. A plugin that allocates on
 * its own sets ATTNBENCH_OWN_ALLOCATIONS, and its rows give the process's peak RSS growth
 * instead (named so in the row).
 */
typedef struct attnbench_allocator {
    void *ctx;
    void *(*alloc)(void *ctx, size_t bytes, size_t align);
    void (*free)(void *ctx, void *ptr);
} attnbench_allocator;

#define ATTNBENCH_OWN_ALLOCATIONS 1u

typedef struct attnbench_plugin {
    uint32_t abi_version; /* ATTNBENCH_ABI_VERSION: first, so any version can be read */
    uint32_t flags;       /* ATTNBENCH_OWN_ALLOCATIONS or 0 */
    const char *name;     /* shown in messages */
    /* NULL when the plugin runs this case; else why not (a static string): the row is
     * `skipped` with that reason. Required. */
    const char *(*supports)(const attnbench_case *c);
    /* Predicted scratch bytes of forward() for this case, shown beside the measured
     * figure; NULL when the plugin makes no prediction. */
    uint64_t (*workspace_bytes)(const attnbench_case *c);
    /* o = attention(q, k, v). Returns 0 on success; anything else fails the case (the row
     * is `error`, with last_error's message). Required. */
    int32_t (*forward)(const attnbench_case *c, const attnbench_tensor *q,
                       const attnbench_tensor *k, const attnbench_tensor *v,
                       attnbench_tensor *o, const attnbench_allocator *scratch);
    /* The message of the last failed forward(), or NULL. Optional (NULL). */
    const char *(*last_error)(void);
} attnbench_plugin;

/* The one symbol attnbench looks up. */
const attnbench_plugin *attnbench_plugin_entry(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTNBENCH_H */
