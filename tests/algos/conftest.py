"""Shared fixtures for the algos tests: single-threaded torch (2 shared CPU cores) and a fixed seed."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _torch_setup():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield

