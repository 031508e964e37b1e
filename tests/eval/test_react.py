"""The ReAct prompt (``prompt=react``) and the one action parser accepting its layout."""

from __future__ import annotations

from agent_rl.rollout import TurnContext, get_prompt, parse_action
from agent_rl.rollout.prompts.react import ALFWORLD_EXAMPLE


def test_parser_accepts_react_output():
    cases = {
        "Thought: the mug is on the desk.\nAction: take mug 1 from desk 1": ("take mug 1 from desk 1", True),
        # a model that goes on imagining the episode: the first action is this turn's
        "Thought: go.\nAction: go to sinkbasin 1\nObservation: ...\nAction: clean mug 1 with sinkbasin 1":
            ("go to sinkbasin 1", True),
        "thought: x\naction:   move  mug 1 to   coffeemachine 1  ": ("move mug 1 to coffeemachine 1", True),
        "> think: I need a tomato.\nOK.\n> go to countertop 1": ("go to countertop 1", True),
        "Action: click[buy now]</action>": ("click[buy now]", True),
        # the tag format still wins, and free text is still flagged
        "Thought: x\nAction: look\n<action>inventory</action>": ("inventory", True),
        "I do not know": ("I do not know", False),
    }
    for text, expected in cases.items():
        got = parse_action(text)
        assert (got.action, got.well_formed) == expected, text
    # math/code answers keep their lines: no ReAct extraction there
    assert parse_action("x = 2\nAction: 3", normalize_whitespace=False).action == "x = 2\nAction: 3"


def test_react_prompt_example_parses_to_its_actions():
    prompt = get_prompt("react")
    ctx = TurnContext(task="put a clean mug in coffeemachine", observation="You are in the middle of a room.",
                      admissible=["go to desk 1", "look"], history=[("start", "look")], step=1)
    text = prompt.messages(ctx)[1]["content"]
    assert "Action: move tomato 1 to countertop 1" in text and "go to desk 1" in text and "Thought:" in text
    # every (Thought, Action) block of the few-shot example parses to its action
    blocks = ALFWORLD_EXAMPLE.split("Observation:")[:-1]
    actions = [parse_action(b.split("\n", 1)[1] if b.startswith(" ") else b).action for b in blocks]
    assert actions[:2] == ["go to countertop 1", "take tomato 1 from countertop 1"]
    assert "react_webshop" and get_prompt("react_webshop").messages(ctx)[1]["content"].count("Action: ") >= 3
