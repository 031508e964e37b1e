"""Shared fixtures of the math tests."""

from __future__ import annotations

import pytest

from envs.math import VerifierPool


@pytest.fixture(scope="module")
def pool():
    """Two real math-verify worker processes with a 60 s deadline per check (closed after the module): no check of
    these tests comes near it, even on a busy machine; it only ends one that hangs."""
    pool = VerifierPool(n_workers=2, timeout_s=60.0)
    yield pool
    pool.close()
