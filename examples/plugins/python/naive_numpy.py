"""Naive attention in NumPy: an attention callable for attnbench to copy and adapt.

Run it beside attnbench's own variants with this in the config:

    [python]
    naive-numpy = { call = "naive_numpy:attention", arrays = "numpy", path = ["examples/plugins/python"] }

    [axes]
    variant = ["flash", "python:naive-numpy"]

attnbench starts `python3 -m attnbench_peer --arrays numpy naive_numpy:attention` (the
package is in python/ of the attnbench repository, which attnbench puts on PYTHONPATH
itself when it was built from that checkout; elsewhere `pip install ./python`) and calls

    attention(q, k, v, *, causal, scale, window=None) -> o

- q: [batch, heads, seq_q, head_dim]; k, v: [batch, kv_heads, seq_kv, head_dim]; o has q's
  shape and dtype (np.float32 or np.float16; NumPy has no bf16).
- GQA: query head h uses K/V head h // (heads // kv_heads).
- causal is bottom-right aligned: query row i (0-based) sees keys j <= i + seq_kv - seq_q.
- window w: each query attends the last w keys up to its causal bound (without causal, the
  last w keys of the sequence).
- A row that sees no key (causal with seq_q > seq_kv) is 0.

This one materialises the whole [seq_q, seq_kv] score matrix per head in float32: simple,
and O(seq_q * seq_kv) memory.
"""

import numpy as np


def attention(q, k, v, *, causal, scale, window=None):
    b, h, nq, d = q.shape
    kvh, nkv = k.shape[1], k.shape[2]
    group = h // kvh
    # Query heads kvh*group + r share K/V head kvh: group them on an axis of their own.
    q32 = q.astype(np.float32).reshape(b, kvh, group, nq, d)
    k32 = k.astype(np.float32)[:, :, None]
    v32 = v.astype(np.float32)[:, :, None]
    s = (q32 @ k32.swapaxes(-1, -2)) * np.float32(scale)  # [b, kvh, group, nq, nkv]

    rows, cols = np.arange(nq)[:, None], np.arange(nkv)[None, :]
    hi = np.clip(rows + nkv - nq + 1, 0, nkv) if causal else np.full((nq, 1), nkv)
    visible = cols < hi
    if window is not None:
        visible &= cols >= hi - window
    s = np.where(visible, s, np.float32(-np.inf))

    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(m == -np.inf, np.float32(0), m))
    total = p.sum(axis=-1, keepdims=True)
    o = (p @ v32) / np.where(total == 0, np.float32(1), total)
    return o.reshape(b, h, nq, d).astype(q.dtype)
