"""Fixtures for learner tests: the tiny random Llama, built once per session and copied per test."""

from __future__ import annotations

import copy

import pytest
import torch

from agent_rl.learner.config import ModelConfig
from agent_rl.models import load_policy

torch.set_num_threads(1)  # tiny ops on 2 shared cores stall with more torch threads


@pytest.fixture(scope="session")
def tiny_base():
    model, tokenizer = load_policy(ModelConfig(name="tiny"))
    return model, tokenizer


@pytest.fixture()
def tiny(tiny_base):
    model, tokenizer = tiny_base
    return copy.deepcopy(model), tokenizer
