// Shared by every attnbench kernel (prepended to each source before NVRTC compiles it; no
// CUDA headers are needed, so the kernels also compile where only libnvrtc is installed).
//
// ELEM_KIND selects the storage dtype of Q, K, V (and of P/E where a GEMM consumes it):
//   0 = f32, 1 = bf16, 2 = f16. Low precision is stored as 16-bit patterns (`elem_t` =
//   unsigned short) and converted with PTX `cvt`, so compute and accumulation stay f32.
#ifndef ELEM_KIND
#error "ELEM_KIND must be defined (0 = f32, 1 = bf16, 2 = f16)"
#endif

typedef unsigned int u32;
typedef unsigned long long u64;

#define NEG_INF (__int_as_float(0xff800000))
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

#if ELEM_KIND == 0
typedef float elem_t;
#else
typedef unsigned short elem_t;
#endif

__device__ __forceinline__ float bf16_bits_to_f32(unsigned short b) {
    return __uint_as_float(((u32)b) << 16);
}

__device__ __forceinline__ float f16_bits_to_f32(unsigned short h) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
}

// Two f32 values rounded (to nearest even) into one 32-bit register of the storage dtype:
// `lo` in the low half (the element with the smaller index, as mma fragments expect).
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
#if ELEM_KIND == 1
    asm("{ cvt.rn.bf16x2.f32 %0, %1, %2; }" : "=r"(r) : "f"(hi), "f"(lo));
#elif ELEM_KIND == 2
    asm("{ cvt.rn.f16x2.f32 %0, %1, %2; }" : "=r"(r) : "f"(hi), "f"(lo));
#else
    r = 0;  // not used for f32 storage
#endif
    return r;
}

__device__ __forceinline__ float to_f32(elem_t x) {
#if ELEM_KIND == 0
    return x;
#elif ELEM_KIND == 1
    return bf16_bits_to_f32(x);
#else
    return f16_bits_to_f32(x);
#endif
}

__device__ __forceinline__ elem_t from_f32(float x) {
#if ELEM_KIND == 0
    return x;
#else
    return (elem_t)(pack2(x, 0.0f) & 0xffffu);
#endif
}

// Bottom-right aligned causal bound (Shape::visible_keys): query row `row` of `seq_q` sees
// keys [0, visible) of `seq_kv`; rows that see none get output 0.
__device__ __forceinline__ long long visible_keys(int causal, long long row, long long seq_q,
                                                  long long seq_kv) {
    if (!causal) return seq_kv;
    long long v = row + seq_kv - seq_q + 1;
    return v < 0 ? 0 : (v > seq_kv ? seq_kv : v);
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide reduction through `scratch` (one float per warp); every thread gets the result.
// The block size is a multiple of 32 and at most 1024.
__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = lane < nwarps ? scratch[lane] : NEG_INF;
    return warp_max(r);
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(r);
}

// Asynchronous global -> shared copies (sm_80): the flash and decode kernels stage K/V tiles.
__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

// 16 bytes global -> shared, asynchronously; `valid` false zero-fills (src-size 0).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)),
                 "l"(gmem), "r"(n));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
