"""``python3 -m attnbench_peer``: runs the worker (see worker.py)."""

from .worker import main

raise SystemExit(main())
