"""Pure-Python attention callables for the tests (--arrays lists).

`attention` is exact attention on nested lists of floats, with attnbench's semantics (GQA,
bottom-right causal mask, sliding window, 0 for a row with no visible key); the others
misbehave on purpose.
"""

import math
import os
import sys


def attention(q, k, v, *, causal, scale, window=None):
    heads, kv_heads = len(q[0]), len(k[0])
    nq, nkv = len(q[0][0]), len(k[0][0])
    out = []
    for qb, kb, vb in zip(q, k, v):
        out_b = []
        for h in range(heads):
            keys, values = kb[h // (heads // kv_heads)], vb[h // (heads // kv_heads)]
            out_h = []
            for i, qi in enumerate(qb[h]):
                bound = i + nkv - nq  # the last key a causal row sees
                js = [j for j in range(nkv)
                      if (not causal or j <= bound)
                      and (window is None or j > (bound if causal else nkv - 1) - window)]
                scores = [scale * sum(a * b for a, b in zip(qi, keys[j])) for j in js]
                top = max(scores, default=0.0)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights) or 1.0
                out_h.append([sum(w * values[j][c] for w, j in zip(weights, js)) / total
                              for c in range(len(qi))])
            out_b.append(out_h)
        out.append(out_b)
    return out


def boom(q, k, v, *, causal, scale, window=None):
    raise ValueError("boom on purpose")


def wrong_shape(q, k, v, *, causal, scale, window=None):
    out = attention(q, k, v, causal=causal, scale=scale, window=window)
    return [batch[:1] for batch in out]  # [batch, 1, seq_q, head_dim]


def noisy(q, k, v, *, causal, scale, window=None):
    print("noise from print")
    sys.stdout.write("noise from sys.stdout\n")
    sys.__stdout__.write("noise from sys.__stdout__\n")
    sys.__stdout__.flush()
    os.write(1, b"noise on file descriptor 1\n")
    return attention(q, k, v, causal=causal, scale=scale, window=window)


def picky(q, k, v, *, causal, scale, window=None):
    return attention(q, k, v, causal=causal, scale=scale, window=window)


def _picky_supports(case):
    return "picky refuses windows" if case.get("window") is not None else ""


picky.supports = _picky_supports

print("noise at import time")
not_callable = 42
namespace = type("Namespace", (), {"fn": staticmethod(attention)})
