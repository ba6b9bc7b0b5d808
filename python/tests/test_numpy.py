"""NumPy: the example naive_numpy.py against the float64 reference, in-process and served."""

import importlib.util
import os
import sys
import tempfile
import unittest

from .helpers import EXAMPLES_DIR, Peer, make_case, read_f32, reference, write_inputs

HAS_NUMPY = importlib.util.find_spec("numpy") is not None
HAS_JAX = HAS_NUMPY and importlib.util.find_spec("jax") is not None

CASES = [
    make_case(),
    make_case(batch=2, heads=4, kv_heads=2, seq_q=3, seq_kv=7, causal=True),
    make_case(heads=2, kv_heads=1, seq_q=6, seq_kv=4, causal=True),
    make_case(seq_q=6, seq_kv=6, causal=True, window=3),
    make_case(seq_q=4, seq_kv=7, window=2),
    make_case(heads=4, kv_heads=1, seq_q=1, seq_kv=9, causal=True, window=4, mode="decode"),
]


def as_arrays(case, inputs, dtype):
    import numpy as np
    s = case["shape"]
    q = np.array(inputs["q"]).reshape(s["batch"], s["heads"], s["seq_q"], s["head_dim"])
    kv = (s["batch"], s["kv_heads"], s["seq_kv"], s["head_dim"])
    return (q.astype(dtype), np.array(inputs["k"]).reshape(kv).astype(dtype),
            np.array(inputs["v"]).reshape(kv).astype(dtype))


def max_error(got, case, inputs):
    want = reference(case, inputs)
    return max(abs(float(a) - b) for a, b in zip(list(got), want))


@unittest.skipUnless(HAS_NUMPY, "numpy is not installed")
class NaiveNumpyTest(unittest.TestCase):
    def setUp(self):
        sys.path.insert(0, EXAMPLES_DIR)
        keep, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ there
        import naive_numpy
        sys.dont_write_bytecode = keep
        self.attention = naive_numpy.attention
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        sys.path.remove(EXAMPLES_DIR)
        self.dir.cleanup()

    def test_in_process(self):
        import numpy as np
        for case in CASES:
            for dtype, tol in ((np.float32, 1e-5), (np.float16, 3e-3)):
                with self.subTest(case=case["shape"], dtype=dtype):
                    case = {**case, "dtype": "f16" if dtype == np.float16 else "f32"}
                    _, inputs = write_inputs(self.dir.name, case)
                    q, k, v = as_arrays(case, inputs, dtype)
                    o = self.attention(q, k, v, causal=case["causal"],
                                       scale=1 / np.sqrt(q.shape[-1]), window=case["window"])
                    self.assertEqual(o.dtype, dtype)
                    self.assertEqual(o.shape, q.shape)
                    self.assertLess(max_error(o.ravel(), case, inputs), tol)

    def test_served(self):
        peer = Peer("naive_numpy:attention", arrays="numpy", path=[EXAMPLES_DIR])
        try:
            hello = peer.send({"op": "hello", "protocol": 1})
            self.assertIn("numpy ", hello["implementation"])
            for case in CASES + [{**CASES[1], "dtype": "f16"}]:
                with self.subTest(case=case["shape"], dtype=case["dtype"]):
                    request, inputs = write_inputs(self.dir.name, case)
                    self.assertEqual(peer.send(request)["supported"], True)
                    self.assertEqual(len(peer.send({"op": "call", "n": 3})["seconds"]), 3)
                    reply = peer.send({"op": "check"})
                    self.assertTrue(reply["ok"], reply)
                    self.assertGreater(reply["mem_overhead_bytes"], 0)
                    self.assertIn("tracemalloc peak", reply["memory_source"])
                    tol = 3e-3 if case["dtype"] == "f16" else 1e-5
                    self.assertLess(max_error(read_f32(request["output"]), case, inputs), tol)
            reply = peer.send(write_inputs(self.dir.name, make_case(dtype="bf16"))[0])
            self.assertEqual(reply, {"ok": True, "supported": False,
                                     "reason": "NumPy has no bf16 dtype"})
            self.assertEqual(peer.send({"op": "quit"}), {"ok": True})
            self.assertEqual(peer.wait(), 0)
        finally:
            peer.close()


@unittest.skipUnless(HAS_JAX, "jax is not installed")
class JaxRabeStaatsTest(unittest.TestCase):
    def test_small_chunks(self):
        import numpy as np
        from attnbench_peer import jax_rabe_staats
        with tempfile.TemporaryDirectory() as d:
            for case in CASES:
                with self.subTest(case=case["shape"]):
                    _, inputs = write_inputs(d, case)
                    q, k, v = as_arrays(case, inputs, np.float32)
                    # Chunks of 4 queries and 3 keys: several chunks, and padding.
                    run = jax_rabe_staats._compiled(case["causal"], case["window"], 4, 3)
                    o = np.asarray(run(q, k, v, np.float32(1 / np.sqrt(q.shape[-1]))))
                    self.assertLess(max_error(o.ravel(), case, inputs), 1e-5)
                    o = jax_rabe_staats.attention(q, k, v, causal=case["causal"],
                                                  scale=1 / np.sqrt(q.shape[-1]),
                                                  window=case["window"])
                    self.assertLess(max_error(o.ravel(), case, inputs), 1e-5)


if __name__ == "__main__":
    unittest.main()
