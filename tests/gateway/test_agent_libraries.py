"""Agent libraries from PyPI driving a real gateway (the tiny model behind the real HF engine): every field each
library sends is served (none refused), and the history each library rewrites still extends its segment. Each test
is skipped when its library is not installed (optional test dependencies: ``smolagents``, ``langgraph`` with
``langchain-openai``, ``openai-agents``)."""

from __future__ import annotations

import pytest

from tests.gateway.test_gateway import Live, policy  # noqa: F401 (the module's policy fixture)


@pytest.fixture(scope="module")
def gw(policy):  # noqa: F811
    live = Live(policy, max_new_tokens=24, max_prompt_tokens=8000)
    yield live
    live.close()


def _extends(prev, turn, tok, suffix: str = "") -> bool:
    head = prev.prompt_ids + prev.response_ids + (tok.encode(suffix, add_special_tokens=False) if suffix else [])
    return turn.prompt_ids[:len(head)] == head


def test_smolagents_code_agent_rewritten_history_extends_its_segment(gw, policy):  # noqa: F811
    """smolagents' CodeAgent asks for stop strings, then writes each reply back stripped with ``</code>`` appended:
    the ``stop`` normalisation, so its steps are one segment; its final-answer call (a new system prompt) is a
    prefix break counted as ``history_edited``."""
    smolagents = pytest.importorskip("smolagents")
    tok = policy[1]
    s = gw.session(temperature=0.0)
    model = smolagents.OpenAIServerModel(model_id="policy", api_base=f"{gw.url}/v1", api_key=s.api_key)
    agent = smolagents.CodeAgent(tools=[], model=model, max_steps=3, verbosity_level=0)
    agent.run("What is 2+2?")  # the tiny model writes no code: 3 failed steps, then the final-answer call
    assert len(s.turns) == 4 and s.ignored and all(isinstance(v, int) for d in s.ignored for v in d.values())
    assert [t.segment for t in s.turns] == [0, 0, 0, 1]
    assert s.breaks == {"history_edited": 1} and s.rewrites == 2
    for k in (1, 2):  # the reply as sampled, then the "</code>" smolagents appended, as context
        assert s.turns[k].info["history_rewrite"] == "stop"
        assert _extends(s.turns[k - 1], s.turns[k], tok, "</code>")


def test_langgraph_react_agent_through_the_gateway(gw, policy):  # noqa: F811
    """LangGraph's prebuilt ReAct agent with langchain-openai's ChatOpenAI and a tool: every field it sends is
    served (none refused) and the call is recorded."""
    pytest.importorskip("langgraph")
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    @tool
    def calc(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 (test tool, digits only)

    s = gw.session(temperature=0.0)
    llm = langchain_openai.ChatOpenAI(model="policy", base_url=f"{gw.url}/v1", api_key=s.api_key, max_retries=0,
                                      temperature=0.7, max_tokens=16)
    agent = create_react_agent(llm, [calc])
    out = agent.invoke({"messages": [("user", "What is 2+2?")]})
    assert out["messages"][-1].type == "ai" and len(s.turns) >= 1
    assert s.ignored[0] == {"temperature": 3}  # the trainer's temperature won; the reply said so
    assert out["messages"][-1].response_metadata.get("finish_reason") in ("stop", "length", "tool_calls")


def test_smolagents_tool_calling_agent_tool_choice_required(gw, policy):  # noqa: F811
    """smolagents' ToolCallingAgent sends ``tool_choice: "required"`` with its tools: served by writing the format's
    call opening after the prompt (the recorded prompt ids end with it); the tiny model's call after it is no valid
    call, so the turn is recorded invalid and the agent gets the text."""
    smolagents = pytest.importorskip("smolagents")
    from agent_rl.gateway.app import call_opening

    @smolagents.tool
    def calc(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: digits and + - * /.
        """
        return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 (test tool)

    tok = policy[1]
    s = gw.session(temperature=0.0)
    model = smolagents.OpenAIServerModel(model_id="policy", api_base=f"{gw.url}/v1", api_key=s.api_key)
    agent = smolagents.ToolCallingAgent(tools=[calc], model=model, max_steps=2, verbosity_level=0)
    agent.run("What is 2+2?")
    opening = tok.encode(call_opening(gw.orch.runner.builder.tool_format, None), add_special_tokens=False)
    forced = [t for t in s.turns if t.prompt_ids[-len(opening):] == opening]
    assert forced and all(t.invalid for t in forced)


def test_openai_agents_sdk_reply_cut_at_the_cap(gw, policy):  # noqa: F811
    """The OpenAI Agents SDK's default request (``OpenAIResponsesModel``: ``model``, ``include: []``, ``input``,
    ``instructions``, ``tools``) is served, none of it refused or replaced. The untrained tiny model's reply runs to the
    gateway's cap (24 tokens): the response is ``incomplete`` (``max_output_tokens``), as OpenAI's, and the SDK raises
    ``ModelBehaviorError`` for it (the turn is recorded all the same); over ``OpenAIChatCompletionsModel`` the same
    reply (``finish_reason: "length"``) is the run's final output."""
    pytest.importorskip("agents")
    from agents import (Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, RunConfig, Runner,
                        function_tool)
    from agents.exceptions import ModelBehaviorError
    from openai import AsyncOpenAI

    @function_tool
    def calc(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 (test tool)

    def run(model_class, session):
        client = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=session.api_key, max_retries=0)
        agent = Agent(name="calculator", instructions="Use calc.", tools=[calc],
                      model=model_class(model="policy", openai_client=client))
        return Runner.run_sync(agent, "What is 2+2?", max_turns=2, run_config=RunConfig(tracing_disabled=True))

    s, c = gw.session(temperature=0.0), gw.session(temperature=0.0)
    with pytest.raises(ModelBehaviorError, match="incomplete.*max_output_tokens"):
        run(OpenAIResponsesModel, s)
    out = run(OpenAIChatCompletionsModel, c)
    assert len(s.turns) == len(c.turns) == 1 and s.ignored == c.ignored == [{}]
    assert len(s.turns[0].response_ids) == 24 and s.turns[0].response_ids == c.turns[0].response_ids
    assert out.final_output == policy[1].decode(c.turns[0].response_ids)
