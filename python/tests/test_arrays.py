"""The array kinds in-process: raw f32 files to nested lists and back, and size checks."""

import os
import tempfile
import unittest

from attnbench_peer.arrays import Lists, read_f32
from attnbench_peer.worker import implementation, load_callable

from .helpers import read_f32 as read_back
from .helpers import write_f32


class ListsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "x.f32")

    def tearDown(self):
        self.dir.cleanup()

    def test_round_trip(self):
        values = [float(i) - 5.5 for i in range(24)]
        write_f32(self.path, values)
        kind = Lists()
        x = kind.load(self.path, (2, 3, 1, 4), "f32", "cpu")
        self.assertEqual(kind.shape(x), (2, 3, 1, 4))
        self.assertEqual(x[1][2][0], [14.5, 15.5, 16.5, 17.5])
        x[0][0][0][0] = float("nan")
        x[1][2][0][3] = float("inf")
        kind.save_f32(x, self.path)
        back = read_back(self.path)
        self.assertNotEqual(back[0], back[0])  # NaN written as it is
        self.assertEqual(back[23], float("inf"))
        self.assertEqual(list(back[1:23]), values[1:23])

    def test_wrong_size_is_refused(self):
        write_f32(self.path, [1.0] * 7)
        with self.assertRaisesRegex(ValueError, "has 28 bytes, expected 32"):
            read_f32(self.path, (1, 2, 1, 4))

    def test_ragged_output_is_refused(self):
        with self.assertRaisesRegex(ValueError, "ragged"):
            Lists().shape([[[[1.0]], [[1.0, 2.0]]]])
        with self.assertRaises(TypeError):
            Lists().shape(3.0)

    def test_refusals(self):
        self.assertEqual(Lists().refuse("f32", "cpu"), "")
        self.assertIn("f32 only", Lists().refuse("bf16", "cpu"))
        self.assertIn("cpu only", Lists().refuse("f32", "cuda"))


class LoadCallableTest(unittest.TestCase):
    def test_dotted_and_bad_specs(self):
        self.assertTrue(callable(load_callable("os.path:join")))
        self.assertTrue(callable(load_callable("attnbench_peer.worker:Worker.serve")))
        for spec in ("os.path", ":join", "os.path:"):
            with self.assertRaises(ValueError):
                load_callable(spec)
        with self.assertRaises(TypeError):
            load_callable("os:sep")

    def test_implementation_names_python(self):
        text = implementation("m:f")
        self.assertTrue(text.startswith("attnbench-peer 0.1.0 m:f (python 3."), text)


if __name__ == "__main__":
    unittest.main()
