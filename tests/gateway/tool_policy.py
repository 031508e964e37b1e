"""A policy that writes well-formed tool calls: the tiny model fine-tuned, here, on the exact prompts an agent library
sends through the gateway, to follow a per-call *script* of replies (the first call of a session gets ``script[0]``,
the second ``script[1]``, ...).

How (:func:`tune`): the prompts are read from the gateway itself, never rebuilt by hand. A round runs the library
against a live gateway (the real HF engine over the model being tuned, greedy: temperature 0 as the tests' sessions)
and reads the session's recorded turns. The first turn k that did not answer ``script[k]`` becomes a training example
``(prompt ids, script[k])``: every earlier turn answered its entry, so it is a prompt the library sends to a policy
that follows the script. The model is then trained (plain ``torch.optim.AdamW``, teacher forcing, cross-entropy on the
target ids only) until every target token has probability over :data:`MIN_PROB` (so greedy decoding writes the
targets exactly, with a margin against the engine's cached decode rounding differently), and the next round reads
the prompts the library sends to the improved policy. Round 0 (the random model) gives the first prompt, round 1 the
prompt after the tool's result, round 2 finds every call answered: tuned. A library that writes the gateway's
random call ids into its prompts (smolagents) is trained with fresh ids at every step (:meth:`Example.draw`), and
the next round checks a fresh run's ids are answered alike. Learning the exact prompt ids (not a rendering
of them written here) keeps every library's own system prompt, tool schema and history form in the examples.

The call texts come from the gateway's own tool-call format (``fmt.render_call``: what its parser reads back); a
prompt that already ends with the format's call opening (``tool_choice="required"``: the gateway wrote it) is trained
on the rest of the call only. Each target ends with the end-of-turn id (``<|im_end|>``); a call's reply is cut by the
format's stop string before it.
"""

from __future__ import annotations

import copy
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from agent_rl.gateway.app import call_opening
from agent_rl.gateway.recorder import GatewaySession

QUESTION = "What is 2+2?"
CALC_ARGS = {"expression": "2+2"}
ANSWER = "4"
MIN_PROB = 0.95
"""Every target token's teacher-forced probability after tuning (greedy then writes the target)."""


def calc_value(expression: str) -> str:
    """The test tool's arithmetic: digits and ``+ - * /`` only."""
    if not expression or set(expression) - set("0123456789+-*/ ."):
        raise ValueError(f"not an arithmetic expression: {expression!r}")
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 (checked above: digits and operators)


@dataclass
class Tuned:
    """A fine-tuned copy of the tiny model and how it was made: ``seconds`` (wall time of all rounds, the library
    runs included), ``rounds`` (library runs), ``steps`` (optimizer steps), ``examples`` it was trained on."""

    model: torch.nn.Module
    tokenizer: Any
    script: list[str]
    seconds: float = 0.0
    rounds: int = 0
    steps: int = 0
    examples: list[Example] = field(default_factory=list)


def target_ids(tok: Any, fmt: Any, prompt_ids: list[int], text: str, eos_id: int) -> list[int]:
    """The ids a prompt is trained to answer with: ``text`` then ``eos_id``; when the prompt already ends with the
    format's call opening (a forced call) and ``text`` is a call, only the text after the opening."""
    opening = call_opening(fmt, None)
    if text.startswith(opening) and tok.decode(prompt_ids).endswith(opening):
        text = text[len(opening):]
    return [int(i) for i in tok.encode(text, add_special_tokens=False)] + [eos_id]


CALL_ID = re.compile(r"call_[0-9a-f]{24}")
"""The gateway's tool-call ids (``call_`` + 12 random bytes in hex): a library that writes them into its history
(smolagents) sends a prompt that differs in them on every run."""


@dataclass
class Example:
    """One training example: ``prompt_ids`` as the gateway recorded them, ``target`` the ids to answer with, and
    where the gateway's call ids lie in the prompt (:meth:`draw` writes fresh ones)."""

    prompt_ids: list[int]
    target: list[int]
    pieces: list[str] = field(default_factory=list)
    spans: list[tuple[int, int, str]] = field(default_factory=list)

    @classmethod
    def of(cls, tok: Any, prompt_ids: list[int], target: list[int]) -> "Example":
        """The example with the token spans of each call id (:data:`CALL_ID`) in the prompt: ``(first token, end
        token, id)``."""
        pieces = [tok.decode([t]) for t in prompt_ids]  # each token's text (the ids are ASCII: pieces join to text)
        text, starts, at = "".join(pieces), [], 0
        for piece in pieces:
            starts.append(at)
            at += len(piece)
        spans = []
        for m in CALL_ID.finditer(text):
            i = max(k for k, st in enumerate(starts) if st <= m.start())
            j = min((k for k, st in enumerate(starts) if st >= m.end()), default=len(pieces))
            spans.append((i, j, m.group()))
        return cls(list(prompt_ids), list(target), pieces if spans else [], spans)

    def draw(self, tok: Any, rng: random.Random) -> list[int]:
        """The prompt with every call id replaced by a fresh random one (the same new id for each occurrence of an
        old one; the tokens spanning it re-encoded); the prompt itself when it holds none."""
        fresh = {old: f"call_{rng.getrandbits(96):024x}" for _, _, old in self.spans}
        ids = list(self.prompt_ids)
        for i, j, old in reversed(self.spans):  # from the end: earlier spans keep their token positions
            ids[i:j] = tok.encode("".join(self.pieces[i:j]).replace(old, fresh[old]), add_special_tokens=False)
        return ids


def _answered(response_ids: list[int], target: list[int]) -> bool:
    """The sampled reply is the target (the call cut by the stop string before the end-of-turn id, or not)."""
    return response_ids == target or response_ids == target[:-1]


def _target_probs(model: torch.nn.Module, prompt: list[int], target: list[int]) -> torch.Tensor:
    """Log-probs of ``target`` after ``prompt`` under teacher forcing, ``(len(target),)``; the LM head runs only on
    the positions that predict the target (a 49k vocabulary over every prompt position would dominate the step)."""
    ids = torch.tensor([prompt + target[:-1]])  # (1, P+T-1)
    hidden = model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1:]  # (T, H): the positions before targets
    logits = model.lm_head(hidden)  # (T, V)
    return torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(target)[:, None])[:, 0]  # (T,)


def fit(model: torch.nn.Module, tok: Any, examples: list[Example], rng: random.Random, *, max_steps: int = 600,
        lr: float = 3e-3, settle: int = 40) -> int:
    """Train ``model`` in place on ``examples`` (full batch, AdamW, mean token cross-entropy), each step on prompts
    with fresh call ids (:meth:`Example.draw`), until every target token has probability over :data:`MIN_PROB` for
    ``settle`` steps in a row (on ids the model had not seen before that step); returns the steps taken.

    Raises:
        AssertionError: not reached in ``max_steps``.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    good = 0
    try:
        for step in range(max_steps + 1):
            logps = [_target_probs(model, ex.draw(tok, rng), ex.target) for ex in examples]
            ok = min(float(lp.detach().min()) for lp in logps) > math.log(MIN_PROB)
            good = good + 1 if ok else 0
            if good >= settle or (ok and not any(ex.spans for ex in examples)):
                return step
            if step == max_steps:
                break
            loss = -torch.cat(logps).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        model.eval()
    raise AssertionError(f"the script was not learned in {max_steps} steps")


def tune(policy: tuple[torch.nn.Module, Any], drive: Callable[[Any, GatewaySession], Any], script: list[str], *,
         live_factory: Callable[[tuple[torch.nn.Module, Any]], Any], max_rounds: int = 5, seed: int = 0) -> Tuned:
    """A copy of ``policy``'s model tuned to answer the k-th call of a session run by ``drive(live, session)`` with
    ``script[k]`` (module docstring). ``live_factory(policy)`` opens a live gateway (``tests.gateway.test_gateway
    .Live``) over a policy; ``drive`` runs the library once in a greedy session of it.

    Raises:
        AssertionError: the library still sends an untrained prompt after ``max_rounds`` runs.
    """
    start = time.perf_counter()
    model, tok = policy
    tuned = Tuned(model=copy.deepcopy(model).eval(), tokenizer=tok, script=list(script))
    eos_id = int(tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(seed)
    rng = random.Random(seed)
    for _ in range(max_rounds):
        live = live_factory((tuned.model, tok))
        try:
            session = live.session(temperature=0.0)
            try:
                drive(live, session)
            except Exception:  # noqa: BLE001 (a library giving up on an untrained reply: its prompts are read below)
                pass
            fmt = live.orch.runner.builder.tool_format
        finally:
            live.close()
        tuned.rounds += 1
        new: list[Example] = []
        for k, turn in enumerate(session.turns[:len(script)]):
            target = target_ids(tok, fmt, turn.prompt_ids, script[k], eos_id)
            if _answered(list(turn.response_ids), target):
                continue
            # the first reply off the script: its prompt is learned (later prompts follow the wrong reply)
            assert all((ex.prompt_ids, ex.target) != (turn.prompt_ids, target) for ex in tuned.examples), \
                "a trained prompt was answered off the script"
            new.append(Example.of(tok, list(turn.prompt_ids), target))
            break
        if not new and len(session.turns) >= len(script):  # every call of the script answered
            tuned.seconds = time.perf_counter() - start
            return tuned
        assert new, f"the library made {len(session.turns)} calls, fewer than the script's {len(script)}"
        tuned.examples += new
        tuned.steps += fit(tuned.model, tok, tuned.examples, rng)
    raise AssertionError(f"the script {script} is still not followed after {max_rounds} library runs")
