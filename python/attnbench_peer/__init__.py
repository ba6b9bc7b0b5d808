"""attnbench-peer: serves a Python attention callable to the attnbench driver.

Run ``python3 -m attnbench_peer [--arrays lists|numpy|torch] MODULE:FUNCTION``; the
driver talks to it over JSON lines on stdin/stdout (see ``worker.py`` and README.md).
"""

__version__ = "0.1.0"
