"""The worker: serves one attention callable to the attnbench driver over JSON lines.

    python3 -m attnbench_peer [--arrays lists|numpy|torch] MODULE:FUNCTION

One JSON object per line on stdin, exactly one JSON reply line per request on stdout, in
order, flushed; EOF on stdin ends the worker (exit 0). Requests (protocol 1):

    hello    {"op":"hello","protocol":1}          -> protocol, implementation
    prepare  {"op":"prepare","case":{...},"inputs":{"q":P,"k":P,"v":P},"output":P}
                                                  -> supported, reason
    call     {"op":"call","n":N}                  -> seconds (one per call)
    check    {"op":"check"}                       -> mem_overhead_bytes, memory_source
                                                     (and the output written to P)
    release  {"op":"release"}
    quit     {"op":"quit"}                        (the worker exits after the reply)

Every reply has "ok"; a request that fails gets {"ok": false, "error": "..."} and the
worker goes on. The callable is called as fn(q, k, v, causal=bool, scale=float,
window=None|int). Only replies go to the real stdout: anything else written to stdout
(print, or C code writing to file descriptor 1) goes to stderr.
"""

import argparse
import importlib
import importlib.metadata
import json
import math
import os
import platform
import sys
import time
import traceback

from . import __version__
from .arrays import KINDS

PROTOCOL = 1
MODES = ("fwd", "decode")
SHAPE_FIELDS = ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim")


class RequestError(Exception):
    """A request the worker cannot serve; its message is the reply's error as it is."""


def describe(e):
    """'ValueError: message' for an exception."""
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def load_callable(spec):
    """Imports MODULE and returns its attribute FUNCTION (dotted names allowed)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected MODULE:FUNCTION, got {spec!r}")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec} is a {type(obj).__name__}, not callable")
    return obj


def library_version(name):
    """The version of an array library, or None when it is not installed."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__version__", None):
        return str(module.__version__)
    if name == "jax":  # named only when the callable imported it
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def implementation(spec):
    parts = [f"python {platform.python_version()}"]
    for name in ("numpy", "torch", "jax"):
        version = library_version(name)
        if version:
            parts.append(f"{name} {version}")
    return f"attnbench-peer {__version__} {spec} ({', '.join(parts)})"


def _int(value, what, minimum):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise RequestError(f"{what} must be an integer >= {minimum}, not {value!r}")
    return value


class Prepared:
    """One prepared case: its inputs, call arguments and latest output."""

    def __init__(self, case):
        if not isinstance(case, dict):
            raise RequestError("case is not a JSON object")
        shape = case.get("shape")
        if not isinstance(shape, dict):
            raise RequestError("case.shape is not a JSON object")
        dims = {f: _int(shape.get(f), f"case.shape.{f}", 1) for f in SHAPE_FIELDS}
        if dims["heads"] % dims["kv_heads"]:
            raise RequestError(f"heads ({dims['heads']}) is not a multiple of "
                               f"kv_heads ({dims['kv_heads']})")
        b, h, kvh = dims["batch"], dims["heads"], dims["kv_heads"]
        self.q_shape = (b, h, dims["seq_q"], dims["head_dim"])
        self.kv_shape = (b, kvh, dims["seq_kv"], dims["head_dim"])
        self.mode = case.get("mode", "fwd")
        self.device = case.get("device", "cpu")
        self.dtype = case.get("dtype", "f32")
        self.threads = case.get("threads", 0)
        causal = case.get("causal", False)
        if not isinstance(causal, bool):
            raise RequestError(f"case.causal must be true or false, not {causal!r}")
        window = case.get("window")
        if window is not None:
            _int(window, "case.window", 0)
        self.kwargs = {"causal": causal, "scale": 1.0 / math.sqrt(dims["head_dim"]),
                       "window": window}
        self.inputs = None
        self.output_path = None
        self.output = None


class Worker:
    def __init__(self, fn, kind, spec):
        self.fn = fn
        self.kind = kind
        self.spec = spec
        self.case = None
        self.done = False

    def serve(self, inp, out):
        """Answers each line of the binary stream inp on the text stream out; returns 0."""
        for raw in inp:
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                reply = {"ok": False, "error": f"bad request line: {e}"}
            else:
                if not line.strip():
                    continue  # a blank line is no request
                reply = self.handle(line)
            try:
                text = json.dumps(reply)
            except (TypeError, ValueError) as e:
                text = json.dumps({"ok": False, "error": f"unserializable reply: {e}"})
            try:
                out.write(text + "\n")
                out.flush()
            except BrokenPipeError:
                return 1
            if self.done:
                break
        return 0

    def handle(self, line):
        """The reply (a dict) to one request line; never raises."""
        try:
            request = json.loads(line)
        except ValueError as e:
            return {"ok": False, "error": f"bad request line: {e}"}
        if not isinstance(request, dict):
            return {"ok": False, "error": "the request is not a JSON object"}
        op = request.get("op")
        handler = self.OPS.get(op) if isinstance(op, str) else None
        if handler is None:
            return {"ok": False, "error": f"unknown op {op!r}"}
        try:
            return handler(self, request)
        except RequestError as e:
            return {"ok": False, "error": str(e)}
        except (Exception, SystemExit) as e:
            traceback.print_exc(file=sys.stderr)
            return {"ok": False, "error": describe(e)}

    def hello(self, request):
        protocol = request.get("protocol")
        if protocol != PROTOCOL:
            raise RequestError(f"this worker speaks protocol {PROTOCOL}, not {protocol}")
        return {"ok": True, "protocol": PROTOCOL, "implementation": implementation(self.spec)}

    def refusal(self, p, case):
        """Why the prepared case p cannot run ("" when it can)."""
        if p.mode not in MODES:
            return f"mode {p.mode} is not supported (fwd and decode only)"
        reason = self.kind.refuse(p.dtype, p.device)
        if reason:
            return reason
        supports = getattr(self.fn, "supports", None)
        if callable(supports):
            reason = supports(case)
            if isinstance(reason, str) and reason:
                return reason
        return ""

    def prepare(self, request):
        self.release(request)
        inputs, output = request.get("inputs"), request.get("output")
        if not isinstance(inputs, dict) or not all(
                isinstance(inputs.get(x), str) for x in "qkv"):
            raise RequestError('inputs must be {"q": PATH, "k": PATH, "v": PATH}')
        if not isinstance(output, str):
            raise RequestError("output must be a path")
        p = Prepared(request.get("case"))
        reason = self.refusal(p, request["case"])
        if reason:
            return {"ok": True, "supported": False, "reason": reason}
        self.kind.setup(p.device, p.threads)
        load = self.kind.load
        p.inputs = (load(inputs["q"], p.q_shape, p.dtype, p.device),
                    load(inputs["k"], p.kv_shape, p.dtype, p.device),
                    load(inputs["v"], p.kv_shape, p.dtype, p.device))
        p.output_path = output
        self.case = p
        return {"ok": True, "supported": True, "reason": ""}

    def prepared(self):
        if self.case is None:
            raise RequestError("no case is prepared")
        return self.case

    def run_once(self, p):
        q, k, v = p.inputs
        return self.fn(q, k, v, **p.kwargs)

    def call(self, request):
        p = self.prepared()
        n = _int(request.get("n"), "n", 0)
        seconds = []
        torch = getattr(self.kind, "torch", None) if p.device == "cuda" else None
        for _ in range(n):
            p.output = None  # the previous output is freed outside the timed region
            self.kind.sync(p.device)
            if torch is not None:
                # GPU time between two events on the current stream, as attnbench times
                # its own CUDA kernels (the host's launch overhead is not in it).
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                o = self.run_once(p)
                end.record()
                end.synchronize()
                seconds.append(start.elapsed_time(end) / 1e3)
            else:
                start = time.perf_counter()
                o = self.run_once(p)
                self.kind.sync(p.device)
                seconds.append(time.perf_counter() - start)
            p.output = o
        return {"ok": True, "seconds": seconds}

    def check(self, request):
        p = self.prepared()
        p.output = None
        o, overhead, source = self.kind.measured_call(lambda: self.run_once(p), p.device)
        p.output = o
        got = self.kind.shape(o)
        if got != p.q_shape:
            raise RequestError(f"the callable returned shape {list(got)}, expected "
                               f"[batch, heads, seq_q, head_dim] = {list(p.q_shape)}")
        self.kind.save_f32(o, p.output_path)
        return {"ok": True, "mem_overhead_bytes": None if overhead is None else int(overhead),
                "memory_source": source}

    def release(self, request):
        if self.case is not None:
            self.case = None
            self.kind.release()
        return {"ok": True}

    def quit(self, request):
        self.done = True
        return {"ok": True}

    OPS = {"hello": hello, "prepare": prepare, "call": call, "check": check,
           "release": release, "quit": quit}


def claim_stdout():
    """Keeps the real stdout for replies and sends everything else written there to stderr."""
    sys.stdout.flush()
    try:
        fd = os.dup(sys.stdout.fileno())
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        out = os.fdopen(fd, "w", encoding="utf-8")
    except (AttributeError, OSError, ValueError):
        out = sys.stdout
    sys.stdout = sys.stderr
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python3 -m attnbench_peer",
        description="Serve a Python attention callable to the attnbench driver "
                    "(JSON lines on stdin/stdout).")
    parser.add_argument("--arrays", choices=sorted(KINDS), default="numpy",
                        help="the arrays the callable takes (default: numpy)")
    parser.add_argument("callable", metavar="MODULE:FUNCTION")
    args = parser.parse_args(argv)  # exits 2 on bad arguments

    out = claim_stdout()  # before any user code runs
    inp = sys.stdin.buffer
    sys.stdin = open(os.devnull)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        kind = KINDS[args.arrays]()
    except ImportError as e:
        print(f"attnbench-peer: --arrays {args.arrays} needs {KINDS[args.arrays].library}: "
              f"{describe(e)}", file=sys.stderr)
        return 2
    try:
        fn = load_callable(args.callable)
    except (Exception, SystemExit) as e:
        traceback.print_exc(file=sys.stderr)
        print(f"attnbench-peer: cannot load {args.callable}: {describe(e)}", file=sys.stderr)
        return 2
    return Worker(fn, kind, args.callable).serve(inp, out)


if __name__ == "__main__":
    raise SystemExit(main())
