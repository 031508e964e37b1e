"""Prompt formats: task extraction, what a per-turn prompt holds, the registry, the plain layout without a template."""

from __future__ import annotations

import pytest

from agent_rl.rollout import TurnContext, get_prompt, parse_action
from agent_rl.rollout.prompts import render, render_followup, render_text

ALF_OBS = ("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you "
           "see a cabinet 1, a coffeemachine 1.\n\nYour task is to: put a clean mug in coffeemachine.")


def test_alfworld_prompt_holds_task_history_observation_admissible():
    p = get_prompt("alfworld")
    task = p.task_text(ALF_OBS, {})
    assert task == "put a clean mug in coffeemachine."
    ctx = TurnContext(task=task, observation="You arrive at cabinet 1.", admissible=["open cabinet 1", "look"],
                      history=[("obs A", "go to desk 1"), ("obs B", "go to cabinet 1")], step=5)
    system, user = p.messages(ctx)
    assert system["role"] == "system" and user["role"] == "user"
    text = user["content"]
    assert text.startswith("Your task is to: put a clean mug in coffeemachine.")
    # the last 2 turns are numbered 4 and 5 (5 actions taken so far), then step 6's observation and actions
    assert "[Observation 4] obs A\n[Action 4] go to desk 1\n[Observation 5] obs B\n[Action 5] go to cabinet 1" in text
    assert "Now at step 6, your observation is: You arrive at cabinet 1." in text
    assert "Admissible actions: [open cabinet 1, look]." in text and "<action>" in text


def test_alfworld_goal_prompt_restates_the_goal_last_in_every_followup():
    plain, goal = get_prompt("alfworld"), get_prompt("alfworld_goal")
    task = goal.task_text(ALF_OBS, {})
    ctx = TurnContext(task=task, observation="You arrive at cabinet 1. ", admissible=["open cabinet 1", "look"],
                      history=[("obs A", "go to cabinet 1")], step=1)
    assert plain.followup(ctx) == "You arrive at cabinet 1.\nAdmissible actions: [open cabinet 1, look]."
    assert goal.followup(ctx) == ("You arrive at cabinet 1.\nAdmissible actions: [open cabinet 1, look].\n"
                                  "Your task is to: put a clean mug in coffeemachine.")
    assert goal.messages(ctx) == plain.messages(ctx)  # the first (per-turn) message already starts with the goal


def test_generic_first_turn_has_no_history_and_plain_layout():
    p = get_prompt("generic")
    ctx = TurnContext(task="pick the sock.", observation="You see: sock, cup.", admissible=["pick sock"])
    msgs = p.messages(ctx)
    assert "turn(s)" not in msgs[1]["content"]

    class NoTemplate:  # no chat template, no special tokens: the plain layout, encoded as UTF-8 bytes
        chat_template = None

        def encode(self, text, add_special_tokens=False):
            return list(text.encode())

    text = render_text(NoTemplate(), msgs)
    assert text.startswith("system: ") and text.endswith("\nassistant:")
    assert render(NoTemplate(), msgs) == list(text.encode())
    # the end of the assistant turn, then the new user turn and the generation prompt
    assert render_followup(NoTemplate(), "obs") == list(b"\nuser: obs\nassistant:")


def test_math_and_code_prompts_keep_answer_lines():
    p = get_prompt("math")
    assert p.task_text("problem + instruction", {"problem": "1+1?", "prompt": "1+1? Please ..."}) == "1+1?"
    assert "\\boxed{}" in p.messages(TurnContext(task="1+1?", observation=""))[1]["content"]
    assert p.raw_actions and get_prompt("code").raw_actions
    code = "```python\ndef f():\n    return 1\n```"
    assert parse_action(code, normalize_whitespace=False).action == code


def test_unknown_prompt_lists_valid():
    with pytest.raises(ValueError, match="valid: .*alfworld.*generic"):
        get_prompt("nope")
