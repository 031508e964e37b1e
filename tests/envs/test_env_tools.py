"""Every built-in env offers both interfaces (``action_format=text|tools``, docs/tools.md).

In tools mode an env declares its tools (``env.unwrapped.tools`` and reset's ``info["tools"]``, the same schemas);
a call plays exactly what the text command plays (a text-mode twin on the same task gives the same observation,
reward and end); a reply without a call, an unknown tool, arguments its schema refuses and a call the client could
not read are invalid actions whose observation gives the reason, leave the game as it was, and never raise. Math
and code with ``tools=["python"]`` run calls in the code sandbox and grade the plain reply. The config accepts
``env.action_format=tools`` for every built-in env preset (the interface the acceptance checks use).
"""

from __future__ import annotations

import os

import gymnasium
import pytest

import envs  # noqa: F401  (registers the ids)
from agent_rl.config.compose import load_config
from agent_rl.config.schema import ConfigError
from envs.tools import decode_action, encode_call, encode_invalid

# id, kwargs, reset options, (text command, the same as a call), a second command (to check nothing moved)
CASES = {
    "alfworld": ("agent_rl/ALFWorld-v0", {}, {"split": "valid_seen", "index": 0}, "act", "command"),
    "textworld": ("agent_rl/TextWorld-v0", {"family": "coin_collector", "level": 1}, {"split": "test", "index": 0},
                  "act", "command"),
    "webshop": ("agent_rl/WebShop-v0", {}, {"split": "val", "index": 0}, "search", "query"),
    "calculator": ("agent_rl/Calculator-v0", {}, {"problem": "What is 3 times 4?", "answer": 12}, "calc",
                   "expression"),
    "choose_item": ("agent_rl/ChooseItem-v0", {}, {"index": 0}, "pick", "item"),
}


@pytest.fixture(scope="module")
def textworld_game(tmp_path_factory):
    """The one TextWorld game these tests play, generated into a folder of their own (~5 s)."""
    from envs.textworld import games as tw_games

    root = tmp_path_factory.mktemp("tw_tools_games")
    old = os.environ.get("AGENT_RL_TEXTWORLD_GAMES")
    os.environ["AGENT_RL_TEXTWORLD_GAMES"] = str(root)
    tw_games._build([("coin_collector", 1, "test", 0)], root)
    yield root
    if old is None:
        os.environ.pop("AGENT_RL_TEXTWORLD_GAMES", None)
    else:
        os.environ["AGENT_RL_TEXTWORLD_GAMES"] = old


TOO_DEEP = "the tool call nested deeper than 64 levels (reached 65; refused before parsing)"


def first_command(name: str, info: dict) -> tuple[str, dict]:
    """A text command of the env and the same command as tool arguments."""
    if name == "webshop":
        return "search[pillow]", {"query": "pillow"}
    if name == "calculator":
        return "calc[3 * 4]", {"expression": "3 * 4"}
    if name == "choose_item":
        return "pick mug", {"item": "mug"}
    command = sorted(info["admissible_actions"])[0]
    return command, {"command": command}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_call_plays_the_text_command_and_bad_calls_are_invalid(name, request):
    if name == "alfworld":
        request.getfixturevalue("require_alfworld")
    if name == "textworld":
        request.getfixturevalue("textworld_game")
    env_id, kwargs, options, tool, arg = CASES[name]
    text_env = gymnasium.make(env_id, max_episode_steps=20, **kwargs)
    tool_env = gymnasium.make(env_id, action_format="tools", max_episode_steps=20, **kwargs)
    try:
        obs_t, info_t = text_env.reset(seed=0, options=options)
        obs, info = tool_env.reset(seed=0, options=options)
        assert "tools" not in info_t and text_env.unwrapped.tools == []
        assert info["tools"] == tool_env.unwrapped.tools and tool in [t["function"]["name"] for t in info["tools"]]
        for schema in info["tools"]:  # OpenAI function schemas
            assert schema["type"] == "function" and schema["function"]["parameters"]["type"] == "object"
        assert obs == obs_t or name == "calculator"  # the calculator's intro names its tools instead of the syntax
        # invalid calls first: each answered with its reason, nothing played
        names = ", ".join(t["function"]["name"] for t in info["tools"])
        bad = [("I would rather talk.", f"the reply calls no tool; answer with one call of: {names}"),
               (encode_call("teleport", {"to": "x"}), f"unknown tool 'teleport'; the tools are: {names}"),
               (encode_call(tool, {"wrong": 1}), f"wrong arguments for {tool}: '{arg}' is a required property"),
               (encode_invalid("the <tool_call> block is not JSON (x)", "<tool_call>{"),
                "the <tool_call> block is not JSON (x)"),
               # JSON nested 1500 deep (1.5 KB), unterminated or whole: RecursionError in json.loads before
               (f'{{"name": "{tool}", "arguments": ' + "[" * 1500, TOO_DEEP),
               (f'{{"name": "{tool}", "arguments": {{"{arg}": ' + "[" * 1500 + "]" * 1500 + "}}", TOO_DEEP)]
        for action, reason in bad:
            o, r, term, trunc, i = tool_env.step(action)
            assert i["invalid_action"] is True and i["tool_error"] == reason, (action, i.get("tool_error"))
            assert o.startswith(f"Invalid tool call: {reason}") and r == 0.0 and not term
        # then a good call: exactly what the text command does in the twin env
        command, arguments = first_command(name, info_t)
        expected = text_env.step(command)
        got = tool_env.step(encode_call(tool, arguments))
        assert got[0] == expected[0] and got[1:4] == expected[1:4]
        assert got[4]["invalid_action"] == expected[4].get("invalid_action", False)
    finally:
        text_env.close()
        tool_env.close()


def test_math_with_the_python_tool_is_multi_turn(require_dataset):
    require_dataset("math")
    env = gymnasium.make("agent_rl/Math-v0", action_format="tools", tools=["python"], max_episode_steps=3)
    text = gymnasium.make("agent_rl/Math-v0")
    options = {"dataset": "gsm8k", "split": "test", "index": 0}
    obs, info = env.reset(seed=0, options=options)
    _, info_text = text.reset(seed=0, options=options)
    assert [t["function"]["name"] for t in info["tools"]] == ["python"] and "python tool" in obs
    o, r, term, trunc, i = env.step(encode_call("python", {"code": "print(16 - 3 - 4)\nprint(9 * 2)"}))
    assert (o, r, term, trunc) == ("9\n18", 0.0, False, False) and i["tool_ok"] and not i["invalid_action"]
    o, r, term, trunc, i = env.step(encode_call("python", {"code": "1/0"}))
    assert o == "ZeroDivisionError: division by zero" and not i["tool_ok"] and not term
    answer = "She sells 9 eggs at $2 each: \\boxed{18}"
    o, r, term, trunc, i = env.step(answer)  # the reply without a call: graded as in text mode
    t = text.step(answer)
    assert (r, term) == (t[1], t[2]) == (1.0, True) and i["reason"] == t[4]["reason"] == "correct"
    # the turn budget: two calls, then the third turn is truncated with reward 0
    env.reset(seed=0, options=options)
    env.step(encode_call("python", {"code": "print(1)"}))
    o, r, term, trunc, i = env.step(encode_call("python", {"code": "print(2)"}))
    assert not term and not trunc
    o, r, term, trunc, i = env.step(encode_call("python", {"code": "print(3)"}))
    assert (r, term, trunc) == (0.0, False, True)
    env.reset(seed=0, options=options)
    o, r, term, trunc, i = env.step('{"name": "python", "arguments": {"code": ' + "[" * 1500)
    assert i["invalid_action"] and i["tool_error"] == TOO_DEEP and not term


def test_task_envs_without_tools_stay_single_turn():
    env = gymnasium.make("agent_rl/Math-v0", action_format="tools")
    _, info = env.reset(seed=0)
    assert info["tools"] == []
    assert env.step("\\boxed{0}")[2] is True  # terminated at the first reply, a JSON-looking one included
    env.reset(seed=0)
    assert env.step(encode_call("python", {"code": "print(1)"}))[2] is True


def test_code_with_the_python_tool(require_dataset):
    require_dataset("code")
    env = gymnasium.make("agent_rl/Code-v0", action_format="tools", tools=["python"], max_episode_steps=3)
    obs, info = env.reset(seed=0, options={"dataset": "mbpp", "index": 0})
    assert info["tools"][0]["function"]["name"] == "python" and "python tool" in obs
    o, r, term, trunc, i = env.step(encode_call("python", {"code": "print(sum(range(5)))"}))
    assert (o, term) == ("10", False)
    o, r, term, trunc, i = env.step(encode_call("python", {}))
    assert i["invalid_action"] and i["tool_error"] == "wrong arguments for python: 'code' is a required property"
    o, r, term, trunc, i = env.step("I give up.")
    assert term and r == 0.0 and i["reason"] == "syntax_error"
    env.reset(seed=0, options={"dataset": "mbpp", "index": 0})
    o, r, term, trunc, i = env.step('{"name": "python", "arguments": ' + "[" * 1500)
    assert i["invalid_action"] and i["tool_error"] == TOO_DEEP and not term


@pytest.mark.parametrize("env_id", ["agent_rl/Calculator-v0", "agent_rl/ChooseItem-v0", "agent_rl/Math-v0",
                                    "agent_rl/Code-v0"])
def test_bad_action_format_and_tools_are_refused(env_id):
    with pytest.raises(ValueError, match="action_format must be one of text, tools, got 'json'"):
        gymnasium.make(env_id, action_format="json")
    if env_id in ("agent_rl/Math-v0", "agent_rl/Code-v0"):
        with pytest.raises(ValueError, match=r"unknown tools \['shell'\]; valid: \['python'\]"):
            gymnasium.make(env_id, action_format="tools", tools=["shell"])
        with pytest.raises(ValueError, match="need action_format='tools'"):
            gymnasium.make(env_id, tools=["python"])


def test_decode_action_reads_what_encode_writes():
    tools = gymnasium.make("agent_rl/Calculator-v0", action_format="tools").unwrapped.tools
    call = decode_action(encode_call("answer", {"answer": 1.5}), tools)
    assert (call.name, call.arguments) == ("answer", {"answer": 1.5})
    assert decode_action('{"note": "a JSON reply without a name"}', tools) is None
    assert decode_action("{not json", tools) is None


PRESETS = [["env=alfworld"], ["env=textworld"], ["env=webshop"], ["env=math"], ["env=code"], ["env=choose_item"],
           ["env=gym", "env.id=agent_rl/Calculator-v0"]]


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p[-1])
def test_every_builtin_env_preset_accepts_action_format_tools(preset):
    cfg = load_config([*preset, "env.action_format=tools", "model=tiny", "env_server.mode=local"])
    assert cfg.env_kwargs["action_format"] == "tools"


def test_tools_config_errors_name_the_fix():
    with pytest.raises(ConfigError, match="env.tools=\\['python'\\] needs env.action_format=tools"):
        load_config(["env=math", "env.tools=[python]", "model=tiny", "env_server.mode=local"])
    with pytest.raises(ConfigError, match="set rollout.max_turns >= 2"):
        load_config(["env=math", "env.action_format=tools", "env.tools=[python]", "model=tiny",
                     "env_server.mode=local"])
    with pytest.raises(ConfigError, match="takes no 'tools' argument, so it offers no tool interface"):
        load_config(["env=choose_item", "env.action_format=tools", "env.tools=[python]", "rollout.max_turns=4",
                     "model=tiny", "env_server.mode=local"])
    with pytest.raises(ConfigError, match="unknown tool-call format 'xml'"):
        load_config(["env=choose_item", "env.action_format=tools", "model.tool_call_format=xml", "model=tiny",
                     "env_server.mode=local"])
    cfg = load_config(["env=math_python", "model=tiny", "env_server.mode=local"])
    assert (cfg.env.action_format, cfg.env.tools, cfg.rollout.max_turns) == ("tools", ["python"], 4)
    assert cfg.env_kwargs == {"action_format": "tools", "tools": ["python"], "max_episode_steps": 4}
