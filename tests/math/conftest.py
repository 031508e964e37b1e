"""Shared fixtures of the math tests."""

from __future__ import annotations

import pytest

from envs.math import VerifierPool


@pytest.fixture(scope="module")
def pool():
    """Two real math-verify worker processes with a 10 s deadline per check (closed after the module)."""
    pool = VerifierPool(n_workers=2, timeout_s=10.0)
    yield pool
    pool.close()
