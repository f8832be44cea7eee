"""Test configuration.

The suite's linear algebra is many small products; multi-threaded BLAS gains nothing on
them and becomes tens of times slower when the 2 cores are oversubscribed (measured: a
600 x 104 Gram product 2 ms single-threaded vs 82 ms with 2 threads under load). Pin BLAS
to one thread before numpy is imported, unless the caller chose otherwise.

The suite runs on pytest-xdist workers (``-n auto`` in pyproject.toml): one per core, at most
four, since many tests start processes, Ray or Flower of their own. ``-n 0`` runs it in one
process.
"""

import os
import sys
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/problems.py


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, at most four."""
    return max(1, min(4, os.cpu_count() or 1))
