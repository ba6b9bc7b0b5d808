"""The worker's protocol, driven over pipes with the pure-Python callables of listcall.py."""

import importlib.util
import json
import os
import tempfile
import unittest

from .helpers import Peer, make_case, read_f32, reference, write_f32, write_inputs

HAS_NUMPY = importlib.util.find_spec("numpy") is not None

# (name, case): GQA, causal with seq_q < seq_kv and > seq_kv, windows, decode.
CASES = [
    ("plain", make_case()),
    ("gqa causal seq_q < seq_kv", make_case(batch=2, heads=4, kv_heads=2, seq_q=3, seq_kv=7,
                                            causal=True)),
    ("causal seq_q > seq_kv", make_case(heads=2, kv_heads=1, seq_q=6, seq_kv=4, causal=True)),
    ("causal window", make_case(seq_q=6, seq_kv=6, causal=True, window=3)),
    ("window without causal", make_case(seq_q=4, seq_kv=7, window=2)),
    ("decode", make_case(heads=4, kv_heads=1, seq_q=1, seq_kv=9, causal=True, window=4,
                         mode="decode")),
]


class PeerTest(unittest.TestCase):
    spec = "listcall:attention"

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.peer = Peer(self.spec)

    def tearDown(self):
        self.peer.close()
        self.dir.cleanup()

    def prepare(self, case, seed=1):
        request, inputs = write_inputs(self.dir.name, case, seed)
        return self.peer.send(request), request, inputs

    def assert_output_matches(self, request, case, inputs, tol=1e-5):
        got = read_f32(request["output"])
        want = reference(case, inputs)
        self.assertEqual(len(got), len(want))
        worst = max(abs(a - b) for a, b in zip(got, want))
        self.assertLess(worst, tol)


class SessionTest(PeerTest):
    def test_whole_session(self):
        reply = self.peer.send({"op": "hello", "protocol": 1})
        self.assertEqual(reply["ok"], True)
        self.assertEqual(reply["protocol"], 1)
        self.assertTrue(reply["implementation"].startswith(
            "attnbench-peer 0.1.0 listcall:attention (python "), reply)
        requests = 1
        for seed, (name, case) in enumerate(CASES, 1):
            with self.subTest(name):
                reply, request, inputs = self.prepare(case, seed)
                self.assertEqual(reply, {"ok": True, "supported": True, "reason": ""})
                reply = self.peer.send({"op": "call", "n": 3})
                self.assertTrue(reply["ok"], reply)
                self.assertEqual(len(reply["seconds"]), 3)
                self.assertTrue(all(isinstance(s, float) and s > 0 for s in reply["seconds"]))
                reply = self.peer.send({"op": "check"})
                self.assertTrue(reply["ok"], reply)
                self.assertIsInstance(reply["mem_overhead_bytes"], int)
                self.assertGreaterEqual(reply["mem_overhead_bytes"], 0)
                self.assertIn("tracemalloc", reply["memory_source"])
                self.assert_output_matches(request, case, inputs)
                requests += 3
        self.assertEqual(self.peer.send({"op": "release"}), {"ok": True})
        reply = self.peer.send({"op": "call", "n": 1})
        self.assertEqual(reply["ok"], False)
        self.assertIn("no case is prepared", reply["error"])
        self.assertEqual(self.peer.send({"op": "quit"}), {"ok": True})
        requests += 3
        self.assertEqual(self.peer.wait(close_stdin=False), 0)
        self.assertEqual(len(self.peer.lines), requests)

    def test_eof_exits_0(self):
        self.assertTrue(self.peer.send({"op": "hello", "protocol": 1})["ok"])
        self.assertEqual(self.peer.wait(), 0)

    def test_other_protocol(self):
        reply = self.peer.send({"op": "hello", "protocol": 2})
        self.assertEqual(reply, {"ok": False, "error": "this worker speaks protocol 1, not 2"})

    def test_unsupported_cases(self):
        for case, words in ((make_case(dtype="f16"), "f32 only"),
                            (make_case(dtype="bf16"), "f32 only"),
                            (make_case(device="cuda"), "cpu only"),
                            (make_case(mode="fwd+bwd"), "mode fwd+bwd")):
            reply, _, _ = self.prepare(case)
            self.assertEqual(reply["ok"], True)
            self.assertEqual(reply["supported"], False)
            self.assertIn(words, reply["reason"])
            reply = self.peer.send({"op": "check"})
            self.assertEqual(reply["ok"], False)

    def test_bad_requests_leave_the_session_going(self):
        self.assertEqual(self.peer.send_line("this is not json")["ok"], False)
        self.assertEqual(self.peer.send_line("[1, 2]")["ok"], False)
        self.assertEqual(self.peer.send({"op": "dance"})["ok"], False)
        self.assertEqual(self.peer.send({"protocol": 1})["ok"], False)
        self.peer.send_line("   ", reply=False)  # a blank line is no request
        reply, request, inputs = self.prepare(make_case())
        self.assertTrue(reply["supported"])
        for n in ("3", -1, 2.0, None, True):
            reply = self.peer.send({"op": "call", "n": n})
            self.assertEqual(reply["ok"], False, n)
        self.assertEqual(self.peer.send({"op": "call", "n": 0}), {"ok": True, "seconds": []})
        self.assertTrue(self.peer.send({"op": "check"})["ok"])
        self.assert_output_matches(request, make_case(), inputs)
        self.assertEqual(self.peer.send({"op": "hello", "protocol": 1})["ok"], True)

    def test_bad_prepares(self):
        case = make_case()
        request, _ = write_inputs(self.dir.name, case)
        for broken in ({**request, "inputs": {"q": request["inputs"]["q"]}},
                       {**request, "output": None},
                       {**request, "case": {**case, "shape": {**case["shape"], "kv_heads": 3}}},
                       {**request, "case": {**case, "causal": "yes"}},
                       {**request, "case": "fwd"}):
            self.assertEqual(self.peer.send(broken)["ok"], False, broken)
        missing = {**request, "inputs": {**request["inputs"], "k": self.dir.name + "/nope"}}
        reply = self.peer.send(missing)
        self.assertEqual(reply["ok"], False)
        self.assertTrue(reply["error"].startswith("FileNotFoundError"), reply)
        write_f32(request["inputs"]["v"], [1.0, 2.0])
        reply = self.peer.send(request)
        self.assertEqual(reply["ok"], False)
        self.assertIn("expected", reply["error"])
        # A failed prepare leaves no case behind.
        self.assertEqual(self.peer.send({"op": "call", "n": 1})["ok"], False)


class RaisingCallableTest(PeerTest):
    spec = "listcall:boom"

    def test_exception_is_an_error_reply(self):
        reply, _, _ = self.prepare(make_case())
        self.assertTrue(reply["supported"])
        reply = self.peer.send({"op": "call", "n": 2})
        self.assertEqual(reply, {"ok": False, "error": "ValueError: boom on purpose"})
        reply = self.peer.send({"op": "check"})
        self.assertEqual(reply, {"ok": False, "error": "ValueError: boom on purpose"})
        self.assertTrue(self.peer.send({"op": "hello", "protocol": 1})["ok"])
        self.assertIn("boom on purpose", self.peer.err())  # the traceback


class WrongShapeTest(PeerTest):
    spec = "listcall:wrong_shape"

    def test_wrong_shape_is_an_error(self):
        self.prepare(make_case(batch=1, heads=2, seq_q=5, head_dim=4))
        self.assertTrue(self.peer.send({"op": "call", "n": 1})["ok"])
        reply = self.peer.send({"op": "check"})
        self.assertEqual(reply["ok"], False)
        self.assertIn("[1, 1, 5, 4]", reply["error"])
        self.assertIn("[1, 2, 5, 4]", reply["error"])


class SupportsHookTest(PeerTest):
    spec = "listcall:picky"

    def test_supports_reason(self):
        reply, _, _ = self.prepare(make_case(causal=True, window=2))
        self.assertEqual(reply, {"ok": True, "supported": False,
                                 "reason": "picky refuses windows"})
        reply, _, _ = self.prepare(make_case(causal=True))
        self.assertEqual(reply, {"ok": True, "supported": True, "reason": ""})


class NoisyCallableTest(PeerTest):
    spec = "listcall:noisy"

    def test_stdout_carries_only_replies(self):
        self.assertTrue(self.peer.send({"op": "hello", "protocol": 1})["ok"])
        reply, request, inputs = self.prepare(make_case())
        self.assertTrue(self.peer.send({"op": "call", "n": 2})["ok"])
        self.assertTrue(self.peer.send({"op": "check"})["ok"])
        self.assert_output_matches(request, make_case(), inputs)
        self.assertEqual(self.peer.send({"op": "quit"}), {"ok": True})
        self.assertEqual(self.peer.wait(), 0)
        self.assertEqual(len(self.peer.lines), 5)
        for line in self.peer.lines:
            self.assertIn("ok", json.loads(line))
        err = self.peer.err()
        for noise in ("noise at import time", "noise from print", "noise from sys.stdout",
                      "noise from sys.__stdout__", "noise on file descriptor 1"):
            self.assertIn(noise, err)


class DottedAttributeTest(PeerTest):
    spec = "listcall:namespace.fn"

    def test_dotted_attribute(self):
        reply, request, inputs = self.prepare(make_case(causal=True))
        self.assertTrue(reply["supported"])
        self.assertTrue(self.peer.send({"op": "check"})["ok"])
        self.assert_output_matches(request, make_case(causal=True), inputs)


class StartFailureTest(unittest.TestCase):
    def start(self, args):
        peer = Peer(None, args=args)
        try:
            return peer.wait(), peer.err()
        finally:
            peer.close()

    def test_failures_exit_2(self):
        for args, words in ((["--arrays", "lists", "no_such_module_here:f"], "no_such_module_here"),
                            (["--arrays", "lists", "listcall"], "MODULE:FUNCTION"),
                            (["--arrays", "lists", "listcall:nothing"], "nothing"),
                            (["--arrays", "lists", "listcall:not_callable"], "not callable"),
                            (["--arrays", "tensors", "listcall:attention"], "--arrays"),
                            ([], "MODULE:FUNCTION")):
            rc, err = self.start(args)
            self.assertEqual(rc, 2, args)
            self.assertIn(words, err, args)

    @unittest.skipIf(HAS_NUMPY, "numpy is installed")
    def test_numpy_arrays_without_numpy(self):
        rc, err = self.start(["listcall:attention"])  # --arrays numpy is the default
        self.assertEqual(rc, 2)
        self.assertIn("needs numpy", err)


if __name__ == "__main__":
    unittest.main()
