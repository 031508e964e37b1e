"""vllm engine (GPU only; skipped without CUDA or without vllm installed)."""

from __future__ import annotations

import pytest
import torch

from agent_rl.engines import get_engine
from agent_rl.learner.config import ModelConfig
from agent_rl.models import load_policy

pytestmark = pytest.mark.gpu


def test_vllm_per_row_temperature_logprobs_and_sync(tmp_path):
    pytest.importorskip("vllm")
    model, tok = load_policy(ModelConfig(name="tiny", tiny_hidden_size=128))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    engine = get_engine("vllm", model, tok, model_path=str(tmp_path), dtype="float32", gpu_memory_utilization=0.2)
    prompt = list(tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False))
    gens = engine.generate([prompt, prompt], [0.3, 1.2], max_new_tokens=6, seed=0)
    for g, t in zip(gens, (0.3, 1.2)):
        ids = torch.tensor([prompt + g.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1].float()
        ref = torch.log_softmax(logits / t, -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
        assert float((torch.tensor(g.logprobs) - ref).abs().max()) < 1e-3
    with torch.no_grad():  # after a weight change, sync_weights makes vLLM follow the learner's module
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    engine.sync_weights(model)
    g = engine.generate([prompt], [1.0], max_new_tokens=4, seed=0)[0]
    ids = torch.tensor([prompt + g.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    ref = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
    assert float((torch.tensor(g.logprobs) - ref).abs().max()) < 1e-3
