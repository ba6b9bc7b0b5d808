"""PyTorch's scaled_dot_product_attention, one callable per backend (use --arrays torch).

    python3 -m attnbench_peer --arrays torch attnbench_peer.torch_sdpa:flash

`math`, `flash`, `efficient` and `cudnn` each run
torch.nn.functional.scaled_dot_product_attention under torch.nn.attention.sdpa_kernel
with that one backend (MATH, FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION), so a
backend that cannot take a case fails instead of falling back to another one. Each has a
`supports(case)` that names the cases SDPA cannot compute as attnbench means them (a
window, a causal mask with seq_q != seq_kv) and the ones its backend refuses (efficient and
cuDNN: CUDA only; flash and cuDNN on CUDA: f16/bf16 only; flash has a CPU kernel, torch >=
2.2). torch is imported only when a callable runs, so `supports` works without it. GQA
needs torch >= 2.5 (enable_gqa, passed only when heads != kv_heads).
"""


def _supports(label, cuda_only, half_only):
    def supports(case):
        if case.get("window") is not None:
            return "torch SDPA has no sliding window"
        shape = case.get("shape") or {}
        if case.get("causal") and shape.get("seq_q") != shape.get("seq_kv"):
            return ("torch SDPA's is_causal is top-left aligned, attnbench's causal mask "
                    "bottom-right aligned (they differ when seq_q != seq_kv)")
        if cuda_only and case.get("device") != "cuda":
            return f"the {label} backend runs on CUDA only"
        if half_only and case.get("device") == "cuda" and case.get("dtype") == "f32":
            return f"the {label} backend takes f16 and bf16 only on CUDA"
        return ""
    return supports


def _backend(label, backend, cuda_only=False, half_only=False):
    def attention(q, k, v, *, causal, scale, window=None):
        if window is not None:
            raise ValueError("torch SDPA has no sliding window")
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        extra = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale, **extra)

    attention.__name__ = attention.__qualname__ = label
    attention.__doc__ = f"SDPA with the {backend} backend only."
    attention.supports = _supports(label, cuda_only, half_only)
    return attention


math = _backend("math", "MATH")
flash = _backend("flash", "FLASH_ATTENTION", half_only=True)  # has a CPU kernel too
efficient = _backend("efficient", "EFFICIENT_ATTENTION", cuda_only=True)
cudnn = _backend("cudnn", "CUDNN_ATTENTION", cuda_only=True, half_only=True)
