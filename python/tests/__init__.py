"""Tests of attnbench-peer (python3 -m unittest discover -s python/tests -t python)."""
