"""torch_sdpa: each backend's supports() (no torch needed), and a CPU run where torch is."""

import importlib.util
import tempfile
import unittest

from attnbench_peer import torch_sdpa

from .helpers import EXAMPLES_DIR, Peer, make_case, read_f32, reference, write_inputs

HAS_TORCH = importlib.util.find_spec("torch") is not None


class SupportsTest(unittest.TestCase):
    def test_masks_sdpa_cannot_express(self):
        for fn in (torch_sdpa.math, torch_sdpa.flash, torch_sdpa.efficient, torch_sdpa.cudnn):
            with self.subTest(fn.__name__):
                cuda = make_case(device="cuda", dtype="bf16")
                self.assertEqual(fn.supports(cuda), "")
                self.assertEqual(fn.supports({**cuda, "causal": True}), "")
                self.assertIn("window", fn.supports(make_case(device="cuda", window=8)))
                reason = fn.supports(make_case(device="cuda", seq_q=1, seq_kv=9, causal=True))
                self.assertIn("bottom-right", reason)
                # Not causal, seq_q != seq_kv is fine.
                self.assertEqual(fn.supports(make_case(device="cuda", dtype="f16",
                                                       seq_q=1, seq_kv=9)), "")

    def test_devices_and_dtypes(self):
        cpu = make_case(device="cpu")
        self.assertEqual(torch_sdpa.math.supports(cpu), "")
        self.assertEqual(torch_sdpa.flash.supports(cpu), "")  # flash has a CPU kernel
        self.assertEqual(torch_sdpa.efficient.supports(cpu),
                         "the efficient backend runs on CUDA only")
        self.assertEqual(torch_sdpa.cudnn.supports(cpu), "the cudnn backend runs on CUDA only")
        cuda32 = make_case(device="cuda", dtype="f32")
        self.assertEqual(torch_sdpa.math.supports(cuda32), "")
        self.assertEqual(torch_sdpa.efficient.supports(cuda32), "")
        self.assertIn("f16 and bf16 only", torch_sdpa.flash.supports(cuda32))
        self.assertIn("f16 and bf16 only", torch_sdpa.cudnn.supports(cuda32))


@unittest.skipUnless(HAS_TORCH, "torch is not installed")
class TorchSessionTest(unittest.TestCase):
    def test_math_backend_on_cpu(self):
        with tempfile.TemporaryDirectory() as d:
            peer = Peer("attnbench_peer.torch_sdpa:math", arrays="torch", path=[EXAMPLES_DIR])
            try:
                self.assertIn("torch ", peer.send({"op": "hello", "protocol": 1})["implementation"])
                for case in (make_case(heads=4, kv_heads=2, seq_q=6, seq_kv=6, causal=True),
                             make_case(seq_q=3, seq_kv=8)):
                    request, inputs = write_inputs(d, case)
                    self.assertTrue(peer.send(request)["supported"])
                    self.assertEqual(len(peer.send({"op": "call", "n": 2})["seconds"]), 2)
                    reply = peer.send({"op": "check"})
                    self.assertIsNone(reply["mem_overhead_bytes"])
                    self.assertIn("not measured", reply["memory_source"])
                    got, want = read_f32(request["output"]), reference(case, inputs)
                    self.assertLess(max(abs(a - b) for a, b in zip(got, want)), 1e-5)
                reply = peer.send(write_inputs(d, make_case(window=2))[0])
                self.assertEqual(reply["supported"], False)
            finally:
                peer.close()


if __name__ == "__main__":
    unittest.main()
