"""Test helpers: raw f32 input files, a float64 reference, and a worker driven over pipes."""

import array
import json
import math
import os
import queue
import random
import struct
import subprocess
import sys
import tempfile
import threading

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(TESTS_DIR)
REPO_DIR = os.path.dirname(PYTHON_DIR)
EXAMPLES_DIR = os.path.join(REPO_DIR, "examples", "plugins", "python")


def make_case(batch=1, heads=2, kv_heads=2, seq_q=5, seq_kv=5, head_dim=4, causal=False,
              window=None, dtype="f32", device="cpu", mode="fwd"):
    """A case object as the driver sends it (with a few fields the worker ignores)."""
    return {"variant": "python:test", "mode": mode, "device": device, "dtype": dtype,
            "shape": {"batch": batch, "heads": heads, "kv_heads": kv_heads, "seq_q": seq_q,
                      "seq_kv": seq_kv, "head_dim": head_dim},
            "q_chunk": None, "kv_chunk": None, "causal": causal, "window": window,
            "devices": 1, "threads": 1, "input_dist": "normal", "input_scale": 1.0,
            "seed": 0}


def to_f16(x):
    return struct.unpack("<e", struct.pack("<e", x))[0]


def write_f32(path, values):
    a = array.array("f", values)
    if sys.byteorder == "big":
        a.byteswap()
    with open(path, "wb") as f:
        a.tofile(f)


def read_f32(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder == "big":
        a.byteswap()
    return a


def write_inputs(directory, case, seed=1):
    """Writes q, k, v of the case (values exact in its dtype); returns (request, inputs)."""
    s = case["shape"]
    rng = random.Random(seed)
    rounding = to_f16 if case["dtype"] == "f16" else float
    inputs, paths = {}, {}
    for name, heads, n in (("q", s["heads"], s["seq_q"]), ("k", s["kv_heads"], s["seq_kv"]),
                           ("v", s["kv_heads"], s["seq_kv"])):
        count = s["batch"] * heads * n * s["head_dim"]
        values = array.array("f", [rounding(rng.gauss(0.0, 1.0)) for _ in range(count)])
        paths[name] = os.path.join(directory, f"{name}.f32")
        write_f32(paths[name], values)
        inputs[name] = list(values)
    request = {"op": "prepare", "case": case, "inputs": paths,
               "output": os.path.join(directory, "out.f32")}
    return request, inputs


def reference(case, inputs):
    """Exact attention in float64 over flat inputs; returns the flat output."""
    s = case["shape"]
    b, h, kvh, nq, nkv, d = (s[f] for f in ("batch", "heads", "kv_heads", "seq_q", "seq_kv",
                                          "head_dim"))
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    window, scale = case["window"], 1 / math.sqrt(d)
    out = []
    for bi in range(b):
        for hi in range(h):
            g = hi // (h // kvh)
            kv_base = (bi * kvh + g) * nkv
            for i in range(nq):
                qrow = q[((bi * h + hi) * nq + i) * d:][:d]
                top = min(max(i + nkv - nq + 1, 0), nkv) if case["causal"] else nkv
                low = max(0, top - window) if window is not None else 0
                scores = [scale * sum(qrow[c] * k[(kv_base + j) * d + c] for c in range(d))
                          for j in range(low, top)]
                m = max(scores, default=0.0)
                w = [math.exp(x - m) for x in scores]
                total = sum(w)
                for c in range(d):
                    acc = sum(wj * v[(kv_base + j) * d + c] for wj, j in zip(w, range(low, top)))
                    out.append(acc / total if total else 0.0)
    return out


class Peer:
    """`python3 -m attnbench_peer` as a subprocess, one request and one reply at a time."""

    def __init__(self, spec, arrays="lists", path=(), args=None):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, TESTS_DIR, *path])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.stderr = tempfile.TemporaryFile()
        argv = args if args is not None else ["--arrays", arrays, spec]
        self.proc = subprocess.Popen([sys.executable, "-m", "attnbench_peer", *argv],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, env=env)
        self.lines = []  # every stdout line, as read
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def send_line(self, text, reply=True):
        self.proc.stdin.write(text.encode("utf-8") + b"\n")
        self.proc.stdin.flush()
        if reply:
            line = self._queue.get(timeout=120)
            if line is None:
                raise AssertionError(f"the worker closed stdout; stderr:\n{self.err()}")
            return json.loads(line)

    def send(self, request):
        return self.send_line(json.dumps(request))

    def wait(self, close_stdin=True):
        """Exit status after stdin closes."""
        if close_stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        rc = self.proc.wait(timeout=120)
        return rc

    def err(self):
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._thread.join(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if not stream.closed:
                stream.close()
        self.stderr.close()
