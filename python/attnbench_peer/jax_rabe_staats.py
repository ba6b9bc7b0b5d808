"""Rabe & Staats' chunked attention in JAX, as a callable for --arrays numpy.

    python3 -m attnbench_peer --arrays numpy attnbench_peer.jax_rabe_staats:attention

Written from the idea of Figure 1 of "Self-attention Does Not Need O(n^2) Memory" (Rabe &
Staats, 2021): queries in chunks of 1024 (lax.scan), keys in chunks of 4096 (lax.map); each
key chunk gives its unnormalised values, weight sum and score maximum (under
jax.checkpoint), and the chunks are combined by rescaling with exp(chunk max - overall max).
Added for attnbench: the bottom-right causal mask, the sliding window, GQA (K and V repeated
per query head), and padding to whole chunks. A row with no visible key is 0.

Takes NumPy arrays, computes in float32 on JAX's CPU device and returns a NumPy array of
the input dtype; the host-to-JAX copies are inside the timed call. JAX's CPU threads are
set by XLA_FLAGS when JAX starts, not by the case's threads.
"""

import functools

Q_CHUNK = 1024
K_CHUNK = 4096


@functools.lru_cache(maxsize=None)
def _compiled(causal, window, q_chunk=Q_CHUNK, k_chunk=K_CHUNK):
    import jax
    import jax.numpy as jnp
    from jax import lax

    highest = lax.Precision.HIGHEST

    def run(q, k, v, scale):
        b, h, nq, d = q.shape
        nkv = k.shape[2]
        k = jnp.repeat(k, h // k.shape[1], axis=1)
        v = jnp.repeat(v, h // v.shape[1], axis=1)
        qc, kc = min(q_chunk, nq), min(k_chunk, nkv)
        nq_pad, nkv_pad = -(-nq // qc) * qc, -(-nkv // kc) * kc
        q = jnp.pad(q * scale, ((0, 0), (0, 0), (0, nq_pad - nq), (0, 0)))
        k = jnp.pad(k, ((0, 0), (0, 0), (0, nkv_pad - nkv), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, 0), (0, nkv_pad - nkv), (0, 0)))

        @functools.partial(jax.checkpoint, prevent_cse=False)
        def summarize_chunk(q_c, q_start, k_c, v_c, k_start):
            s = jnp.einsum("bhqd,bhkd->bhqk", q_c, k_c, precision=highest)
            rows = q_start + jnp.arange(qc)[:, None]
            cols = k_start + jnp.arange(kc)[None, :]
            hi = jnp.clip(rows + (nkv - nq + 1), 0, nkv) if causal else nkv
            visible = cols < hi  # also hides the padded keys
            if window is not None:
                visible = visible & (cols >= hi - window)
            s = jnp.where(visible, s, -jnp.inf)
            m = jnp.max(s, axis=-1)
            m_safe = jnp.where(m == -jnp.inf, 0.0, m)
            p = jnp.exp(s - m_safe[..., None])
            values = jnp.einsum("bhqk,bhkd->bhqd", p, v_c, precision=highest)
            return values, p.sum(axis=-1), m

        def query_chunk(q_start):
            q_c = lax.dynamic_slice_in_dim(q, q_start, qc, axis=2)

            def key_chunk(k_start):
                k_c = lax.dynamic_slice_in_dim(k, k_start, kc, axis=2)
                v_c = lax.dynamic_slice_in_dim(v, k_start, kc, axis=2)
                return summarize_chunk(q_c, q_start, k_c, v_c, k_start)

            values, weights, maxes = lax.map(key_chunk, jnp.arange(0, nkv_pad, kc))
            top = jnp.max(maxes, axis=0, keepdims=True)
            alpha = jnp.exp(maxes - jnp.where(top == -jnp.inf, 0.0, top))
            values = (values * alpha[..., None]).sum(axis=0)
            weights = (weights * alpha).sum(axis=0)
            return values / jnp.where(weights == 0, 1.0, weights)[..., None]

        def step(q_start, _):
            return q_start + qc, query_chunk(q_start)

        _, out = lax.scan(step, 0, None, length=nq_pad // qc)  # [chunks, b, h, qc, d]
        out = jnp.moveaxis(out, 0, 2).reshape(b, h, nq_pad, d)
        return out[:, :, :nq]

    return jax.jit(run)


def attention(q, k, v, *, causal, scale, window=None):
    import jax
    import numpy as np

    cpu = jax.devices("cpu")[0]
    q32, k32, v32 = (jax.device_put(np.asarray(x, dtype=np.float32), cpu) for x in (q, k, v))
    out = _compiled(bool(causal), window)(q32, k32, v32, np.float32(scale))
    return np.asarray(out).astype(q.dtype, copy=False)


def supports(case):
    if case.get("device", "cpu") != "cpu":
        return "this callable runs JAX on its CPU device"
    return ""


attention.supports = supports
