"""Array kinds: how the worker loads the driver's raw f32 inputs, and writes outputs back.

A kind turns a raw little-endian float32 C-order file into the arrays a callable takes
(nested Python lists, NumPy arrays or torch tensors, in the case's dtype and device),
reads the shape of what the callable returned, writes it back as raw f32, and runs one
call under a memory measurement.

Each kind has:
  name, library (the module it needs, or None)
  refuse(dtype, device) -> ""  or the reason the case cannot run
  load(path, shape, dtype, device) -> array
  shape(o) -> tuple of ints (raises TypeError when o is not this kind's array)
  save_f32(o, path)
  setup(device, threads), sync(device)
  measured_call(call, device) -> (output, overhead_bytes or None, source)
  release() (gives cached memory back after a case)
"""

import array
import math
import os
import sys
import tracemalloc

DTYPES = ("f32", "f16", "bf16")


def read_f32(path, shape):
    """The file's float32 values as array('f'), after checking its size against shape."""
    count = math.prod(shape)
    size = os.path.getsize(path)
    if size != 4 * count:
        raise ValueError(
            f"{path} has {size} bytes, expected {4 * count} (f32 shape {list(shape)})")
    values = array.array("f")
    with open(path, "rb") as f:
        values.fromfile(f, count)
    if sys.byteorder == "big":
        values.byteswap()
    return values


def write_f32(values, path):
    """Writes array('f') values as raw little-endian float32."""
    if sys.byteorder == "big":
        values = array.array("f", values)
        values.byteswap()
    with open(path, "wb") as f:
        values.tofile(f)


# What the row's reason says; python/README.md says what tracemalloc sees (NumPy's buffers
# and Python objects, not torch's CPU tensors).
TRACEMALLOC_SOURCE = "tracemalloc peak, less the output"


def traced_call(call):
    """Runs call() under tracemalloc; returns (output, peak bytes)."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    else:
        tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        out = call()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()
    return out, max(0, peak)


class ArrayKind:
    """What every array kind does by default: nothing to set up, synchronize or release
    (the CPU kinds, whose calls return when done and whose thread pools the driver sizes
    through the environment)."""

    def setup(self, device, threads):
        pass

    def sync(self, device):
        pass

    def release(self):
        pass


class Lists(ArrayKind):
    """Nested Python lists of floats: f32 on the CPU only. Needs nothing beyond Python."""

    name = "lists"
    library = None

    def refuse(self, dtype, device):
        if dtype != "f32":
            return f"the lists array kind holds f32 only, not {dtype}"
        if device != "cpu":
            return f"the lists array kind runs on cpu only, not {device}"
        return ""

    def load(self, path, shape, dtype, device):
        rows = read_f32(path, shape).tolist()
        for n in reversed(shape[1:]):
            rows = [rows[i:i + n] for i in range(0, len(rows), n)]
        return rows

    def shape(self, o):
        if not isinstance(o, (list, tuple)):
            raise TypeError(f"the callable returned {type(o).__name__}, not a nested list")
        return _list_shape(o)

    def save_f32(self, o, path):
        flat = o
        for _ in range(len(self.shape(o)) - 1):
            flat = [x for row in flat for x in row]
        write_f32(array.array("f", flat), path)

    def measured_call(self, call, device):
        out, peak = traced_call(call)
        # A list output's own objects are in the peak (counted as 0 output bytes).
        return out, peak, "tracemalloc peak, output objects included"


def _list_shape(x):
    if not isinstance(x, (list, tuple)):
        return ()
    if not x:
        return (0,)
    inner = {_list_shape(e) for e in x}
    if len(inner) != 1:
        raise ValueError("the callable's output is a ragged nested list")
    return (len(x),) + inner.pop()


class Numpy(ArrayKind):
    """NumPy arrays, np.float32 or np.float16, on the CPU (NumPy has no bf16)."""

    name = "numpy"
    library = "numpy"

    def __init__(self):
        import numpy
        self.np = numpy

    def refuse(self, dtype, device):
        if dtype == "bf16":
            return "NumPy has no bf16 dtype"
        if dtype not in ("f32", "f16"):
            return f"unknown dtype {dtype}"
        if device != "cpu":
            return f"the numpy array kind runs on cpu only, not {device}"
        return ""

    def load(self, path, shape, dtype, device):
        np = self.np
        read_f32(path, shape)  # the size check
        a = np.fromfile(path, dtype="<f4").reshape(shape)
        return a.astype(np.float16 if dtype == "f16" else np.float32)

    def shape(self, o):
        if not hasattr(o, "shape"):
            raise TypeError(f"the callable returned {type(o).__name__}, not a NumPy array")
        return tuple(int(n) for n in o.shape)

    def save_f32(self, o, path):
        self.np.ascontiguousarray(o, dtype="<f4").tofile(path)

    def measured_call(self, call, device):
        out, peak = traced_call(call)
        return out, max(0, peak - int(getattr(out, "nbytes", 0))), TRACEMALLOC_SOURCE


class Torch(ArrayKind):
    """torch tensors, float32/float16/bfloat16, on the CPU or CUDA."""

    name = "torch"
    library = "torch"

    def __init__(self):
        import torch
        self.torch = torch
        self.dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

    def refuse(self, dtype, device):
        if dtype not in self.dtypes:
            return f"unknown dtype {dtype}"
        if device == "cuda":
            if not self.torch.cuda.is_available():
                return "torch.cuda.is_available() is false"
        elif device != "cpu":
            return f"unknown device {device}"
        return ""

    def setup(self, device, threads):
        if device == "cpu" and isinstance(threads, int) and threads > 0:
            self.torch.set_num_threads(threads)

    def sync(self, device):
        if device == "cuda":
            self.torch.cuda.synchronize()

    def load(self, path, shape, dtype, device):
        t = self.torch.frombuffer(read_f32(path, shape), dtype=self.torch.float32)
        return t.reshape(shape).to(device=device, dtype=self.dtypes[dtype], copy=True)

    def shape(self, o):
        if not isinstance(o, self.torch.Tensor):
            raise TypeError(f"the callable returned {type(o).__name__}, not a torch.Tensor")
        return tuple(o.shape)

    def save_f32(self, o, path):
        t = o.detach().to("cpu", self.torch.float32).contiguous()
        try:
            import numpy
        except ImportError:
            write_f32(array.array("f", t.reshape(-1).tolist()), path)
        else:
            numpy.ascontiguousarray(t.numpy(), dtype="<f4").tofile(path)

    def measured_call(self, call, device):
        torch = self.torch
        if device != "cuda":
            return call(), None, ("not measured (torch CPU allocations are invisible "
                                  "to tracemalloc)")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = call()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        out_bytes = out.numel() * out.element_size() if isinstance(out, torch.Tensor) else 0
        return out, max(0, peak - before - out_bytes), "torch.cuda.max_memory_allocated"

    def release(self):
        if self.torch.cuda.is_initialized():
            self.torch.cuda.empty_cache()


KINDS = {"lists": Lists, "numpy": Numpy, "torch": Torch}
