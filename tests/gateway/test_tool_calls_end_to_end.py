"""Tool calls end to end through the gateway with each agent library (the plain ``openai`` client, LangGraph's
prebuilt ReAct agent over langchain-openai's ``ChatOpenAI``, smolagents' ``ToolCallingAgent``, the OpenAI Agents
SDK's ``Agent`` over its Responses and chat-completions models): a policy that writes
well-formed calls (the tiny model fine-tuned on the library's own prompts, :mod:`tests.gateway.tool_policy`) behind the
real HF engine, so the library gets ``tool_calls``, runs its tool, sends the result back and gets the final answer,
and the session's recorded turns hold both calls with the ids the engine sampled. Two Agents SDK agents in one run (a
handoff, an agent used as a tool) show what a switch of agent does to the recorded segments. Each library's test is
skipped when it is not installed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from typing import Any, Iterator

import httpx
import pytest

from agent_rl.engines import get_engine
from agent_rl.gateway.app import call_opening
from agent_rl.gateway.recorder import GatewaySession
from tests.gateway.test_gateway import Live, RecordingEngine, policy  # noqa: F401 (the module's policy fixture)
from tests.gateway.tool_policy import ANSWER, CALC_ARGS, QUESTION, Tuned, calc_value, tune
from waiting import HANG_S

log = logging.getLogger(__name__)
MAX_NEW_TOKENS = 48
CALC_SCHEMA = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


def _live(policy, engine=None) -> Live:  # noqa: F811
    return Live(policy, max_new_tokens=MAX_NEW_TOKENS, max_prompt_tokens=8000, engine=engine)


def _fmt(policy):  # noqa: F811
    live = _live(policy)
    try:
        return live.orch.runner.builder.tool_format
    finally:
        live.close()


# ------------------------------------------------------------------------------------------------ the libraries
def run_openai(live: Live, session: GatewaySession, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The plain client's tool loop: ask with ``tools=``, run each returned call, send its ``tool`` message (the
    call's id as ``tool_call_id``), ask again. Returns both responses and the messages sent."""
    client = live.client(session)
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=[CALC_SCHEMA],
                                           max_tokens=MAX_NEW_TOKENS)
    msg = first.choices[0].message
    if not msg.tool_calls:
        return {"first": first, "second": None, "messages": messages}
    messages.append(msg.model_dump(exclude_none=True))
    for call in msg.tool_calls:
        args = json.loads(call.function.arguments)
        if calls is not None:
            calls.append(args)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": calc_value(**args)})
    second = client.chat.completions.create(model="policy", messages=messages, tools=[CALC_SCHEMA],
                                            max_tokens=MAX_NEW_TOKENS)
    return {"first": first, "second": second, "messages": messages}


def run_openai_responses(live: Live, session: GatewaySession,
                         calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The plain client's tool loop on the Responses API: a ``function_call`` item, run, its ``function_call_output``
    (the item's ``call_id``) sent after ``previous_response_id``. Returns both responses."""
    client = live.client(session)
    fn = CALC_SCHEMA["function"]
    tools: list[Any] = [{"type": "function", "name": fn["name"], "description": fn["description"],
                         "parameters": fn["parameters"]}]
    first = client.responses.create(model="policy", input=QUESTION, tools=tools, max_output_tokens=MAX_NEW_TOKENS)
    outputs = []
    for item in first.output:
        if item.type == "function_call":
            args = json.loads(item.arguments)
            if calls is not None:
                calls.append(args)
            outputs.append({"type": "function_call_output", "call_id": item.call_id, "output": calc_value(**args)})
    second = client.responses.create(model="policy", previous_response_id=first.id, input=outputs, tools=tools,
                                     max_output_tokens=MAX_NEW_TOKENS) if outputs else None
    return {"first": first, "second": second}


def run_langgraph(live: Live, session: GatewaySession, calls: list[dict[str, Any]] | None = None, *,
                  streaming: bool = False) -> dict[str, Any]:
    """LangGraph's ``create_react_agent`` with a ``@tool`` calc over ``ChatOpenAI`` (``streaming``: its calls
    streamed); returns the graph's output."""
    import langchain_openai
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    @tool
    def calc(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        if calls is not None:
            calls.append({"expression": expression})
        return calc_value(expression)

    llm = langchain_openai.ChatOpenAI(model="policy", base_url=f"{live.url}/v1", api_key=session.api_key,
                                      max_retries=0, timeout=HANG_S, temperature=0.0, max_tokens=MAX_NEW_TOKENS,
                                      streaming=streaming)
    return create_react_agent(llm, [calc]).invoke({"messages": [("user", QUESTION)]}, {"recursion_limit": 6})


def run_smolagents(live: Live, session: GatewaySession, calls: list[dict[str, Any]] | None = None) -> Any:
    """smolagents' ``ToolCallingAgent`` with a ``@smolagents.tool`` calc (2 steps at most); returns the agent."""
    import smolagents

    @smolagents.tool
    def calc(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: digits and + - * /.
        """
        if calls is not None:
            calls.append({"expression": expression})
        return calc_value(expression)

    model = smolagents.OpenAIServerModel(model_id="policy", api_base=f"{live.url}/v1", api_key=session.api_key)
    agent = smolagents.ToolCallingAgent(tools=[calc], model=model, max_steps=2, verbosity_level=0)
    agent.result = agent.run(QUESTION)
    return agent


@contextlib.contextmanager
def _loopback_only(hosts: list[str]) -> Iterator[None]:
    """Every host name looked up while inside is appended to ``hosts``; one that is not the loopback is refused
    (``OSError``), so nothing of the program reaches the network (the Agents SDK's trace export included)."""
    real = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        hosts.append(host.decode() if isinstance(host, bytes) else str(host))
        if hosts[-1] not in ("127.0.0.1", "localhost"):
            raise OSError(f"no network here: {hosts[-1]!r}")
        return real(host, *args, **kwargs)

    socket.getaddrinfo = guarded
    try:
        yield
    finally:
        socket.getaddrinfo = real


def _agents_sdk_parts(live: Live, session: GatewaySession,
                      calls: list[dict[str, Any]] | None) -> tuple[Any, list[tuple[str, dict[str, Any]]], Any]:
    """What every Agents SDK program here shares: the ``@function_tool`` calc (each call's arguments appended to
    ``calls``), the list of ``(path, JSON body)`` the client sends, and the ``AsyncOpenAI`` client of the gateway
    that records them (no retries, :data:`HANG_S` timeouts)."""
    from agents import function_tool
    from openai import AsyncOpenAI

    @function_tool
    def calc(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        if calls is not None:
            calls.append({"expression": expression})
        return calc_value(expression)

    requests: list[tuple[str, dict[str, Any]]] = []

    async def keep(request: httpx.Request) -> None:
        requests.append((request.url.path, json.loads(request.content or b"{}")))

    client = AsyncOpenAI(base_url=f"{live.url}/v1", api_key=session.api_key, max_retries=0, timeout=HANG_S,
                         http_client=httpx.AsyncClient(event_hooks={"request": [keep]}, timeout=HANG_S))
    return calc, requests, client


def run_agents_sdk(live: Live, session: GatewaySession, calls: list[dict[str, Any]] | None = None, *,
                   api: str = "responses", streamed: bool = False, chained: bool = False,
                   follow_up: str | None = None) -> dict[str, Any]:
    """The OpenAI Agents SDK as its users write it: an ``Agent`` with instructions and a ``@function_tool`` calc over
    ``OpenAIResponsesModel`` (``api="chat"``: ``OpenAIChatCompletionsModel``) with an ``AsyncOpenAI`` client of the
    gateway, run by ``Runner.run_sync`` (``streamed``: ``Runner.run_streamed``, its events drained; ``chained``:
    ``auto_previous_response_id=True``; ``follow_up``: then a second run on ``result.to_input_list()`` and that
    user message, as the SDK continues a conversation, its own failure kept in ``"follow_up_error"``), its tracing
    off (``RunConfig(tracing_disabled=True)``) and host lookups limited to the loopback (:func:`_loopback_only`).
    Returns ``{"result": the run's result, "requests": [(path,
    JSON body) sent], "hosts": [host names looked up]}``."""
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, RunConfig, Runner

    calc, requests, client = _agents_sdk_parts(live, session, calls)
    model = OpenAIChatCompletionsModel(model="policy", openai_client=client) if api == "chat" else \
        OpenAIResponsesModel(model="policy", openai_client=client)
    agent = Agent(name="calculator", instructions="Use the calc tool for arithmetic.", tools=[calc], model=model)
    kw: dict[str, Any] = {"max_turns": 3, "run_config": RunConfig(tracing_disabled=True),
                          "auto_previous_response_id": chained}
    out: dict[str, Any] = {"requests": requests, "hosts": []}
    with _loopback_only(out["hosts"]):
        if streamed:
            async def drained() -> Any:
                run = Runner.run_streamed(agent, QUESTION, **kw)
                async for _ in run.stream_events():
                    pass
                return run

            out["result"] = asyncio.run(drained())
        else:
            out["result"] = Runner.run_sync(agent, QUESTION, **kw)
        if follow_up is not None:
            from agents.exceptions import AgentsException
            try:
                Runner.run_sync(agent, out["result"].to_input_list() + [{"role": "user", "content": follow_up}],
                                **kw)
            except AgentsException as exc:  # the tuned policy's reply to an untrained prompt: any is fine here
                out["follow_up_error"] = exc
    return out


TRIAGE = "Hand arithmetic to the specialist."
SPECIALIST = "Use the calc tool for arithmetic."
ASK_ARGS = {"input": "2+2"}
"""What the orchestrator of :func:`run_agents_sdk_team` asks its agent tool (``as_tool``'s one ``input`` string)."""


def run_agents_sdk_team(live: Live, session: GatewaySession, calls: list[dict[str, Any]] | None = None, *,
                        as_tool: bool = False) -> dict[str, Any]:
    """Two Agents SDK agents in one run over ``OpenAIResponsesModel`` (one ``AsyncOpenAI`` client of the gateway):
    a ``specialist`` with instructions :data:`SPECIALIST` and a ``@function_tool`` calc, and a ``triage`` agent with
    instructions :data:`TRIAGE` and ``handoffs=[specialist]`` (the SDK's ``transfer_to_specialist`` tool; the run
    goes on as the specialist after the call). ``as_tool``: the triage agent has ``specialist.as_tool("ask_specialist",
    ...)`` as its one tool instead (a nested run of the specialist per call, its final output the tool's result)
    and answers itself. Run by ``Runner.run_sync`` from the triage agent, tracing off and host lookups limited to the
    loopback as :func:`run_agents_sdk`. Returns ``{"result", "requests": [(path, JSON body) sent], "hosts",
    "agents": {name: Agent}}``."""
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner

    calc, requests, client = _agents_sdk_parts(live, session, calls)
    model = OpenAIResponsesModel(model="policy", openai_client=client)
    config = RunConfig(tracing_disabled=True)
    specialist = Agent(name="specialist", instructions=SPECIALIST, tools=[calc], model=model)
    if as_tool:
        triage = Agent(name="triage", instructions=TRIAGE, model=model, tools=[specialist.as_tool(
            "ask_specialist", "Ask the arithmetic specialist.", run_config=config, max_turns=3)])
    else:
        triage = Agent(name="triage", instructions=TRIAGE, handoffs=[specialist], model=model)
    out: dict[str, Any] = {"requests": requests, "hosts": [], "agents": {"triage": triage, "specialist": specialist}}
    with _loopback_only(out["hosts"]):
        out["result"] = Runner.run_sync(triage, QUESTION, max_turns=4, run_config=config)
    return out


def _tuned(policy, drive, script: list[str], max_rounds: int = 5) -> Tuned:  # noqa: F811
    tuned = tune(policy, drive, script, live_factory=_live, max_rounds=max_rounds)
    log.info("tool policy for %s: %.1f s, %d library runs, %d steps, %d examples", drive.__name__, tuned.seconds,
             tuned.rounds, tuned.steps, len(tuned.examples))
    return tuned


@pytest.fixture(scope="module")
def openai_policy(policy):  # noqa: F811
    fmt = _fmt(policy)
    return _tuned(policy, run_openai, [fmt.render_call("calc", CALC_ARGS), ANSWER])


@pytest.fixture(scope="module")
def langgraph_policy(policy):  # noqa: F811
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    fmt = _fmt(policy)
    return _tuned(policy, run_langgraph, [fmt.render_call("calc", CALC_ARGS), ANSWER])


@pytest.fixture(scope="module")
def smolagents_policy(policy):  # noqa: F811
    pytest.importorskip("smolagents")
    fmt = _fmt(policy)
    return _tuned(policy, run_smolagents, [fmt.render_call("calc", CALC_ARGS),
                                           fmt.render_call("final_answer", {"answer": ANSWER})])


@pytest.fixture(scope="module")
def agents_sdk_policy(policy):  # noqa: F811
    pytest.importorskip("agents")
    fmt = _fmt(policy)
    return _tuned(policy, run_agents_sdk, [fmt.render_call("calc", CALC_ARGS), ANSWER])


def run_agents_sdk_as_tool(live: Live, session: GatewaySession, calls: list[dict[str, Any]] | None = None) -> Any:
    """:func:`run_agents_sdk_team` with the specialist as the triage agent's tool (``as_tool=True``)."""
    return run_agents_sdk_team(live, session, calls, as_tool=True)


@pytest.fixture(scope="module")
def agents_sdk_handoff_policy(policy):  # noqa: F811
    pytest.importorskip("agents")
    fmt = _fmt(policy)
    return _tuned(policy, run_agents_sdk_team, [fmt.render_call("transfer_to_specialist", {}),
                                                fmt.render_call("calc", CALC_ARGS), ANSWER])


@pytest.fixture(scope="module")
def agents_sdk_as_tool_policy(policy):  # noqa: F811
    pytest.importorskip("agents")
    fmt = _fmt(policy)
    return _tuned(policy, run_agents_sdk_as_tool, [fmt.render_call("ask_specialist", ASK_ARGS),
                                                   fmt.render_call("calc", CALC_ARGS), ANSWER, ANSWER], max_rounds=6)


# ------------------------------------------------------------------------------------------------ the checks
def _played(tuned: Tuned, drive) -> tuple[Any, GatewaySession, RecordingEngine, list[dict[str, Any]], Any]:
    """``drive`` once more over the tuned policy behind a recording engine: ``(library output, session, engine,
    the tool's calls, the tool-call format)``."""
    engine = RecordingEngine(get_engine("hf", tuned.model, tuned.tokenizer, seed=0))
    live = _live((tuned.model, tuned.tokenizer), engine=engine)
    calls: list[dict[str, Any]] = []
    try:
        session = live.session(temperature=0.0)
        out = drive(live, session, calls)
        fmt = live.orch.runner.builder.tool_format
    finally:
        live.close()
    return out, session, engine, calls, fmt


def _check_sampled(session: GatewaySession, engine: RecordingEngine) -> None:
    """Each recorded turn is one engine output, in order: prompt in, ids and log-probs out."""
    assert len(engine.outputs) == len(session.turns)
    for turn, (prompt, response, logprobs) in zip(session.turns, engine.outputs):
        assert (turn.prompt_ids, turn.response_ids, turn.response_logprobs) == (prompt, response, logprobs)


TOOL_TURN = "<|im_end|>\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n"
"""What SmolLM2's template writes after a call cut at ``</tool_call>``: the turn's end, calc's result as a ``tool``
message, the next assistant header."""


def _check_turns(session: GatewaySession, engine: RecordingEngine, tok, first_call: str) -> None:
    """Both turns recorded as sampled (:func:`_check_sampled`): the first decodes to the call text and is valid, the
    second's prompt is the first's prompt and response, then only the tool result (one segment), and it answers
    the text ``4`` then the end of turn."""
    _check_sampled(session, engine)
    a, b = session.turns
    assert tok.decode(a.response_ids) == first_call and not a.invalid
    assert a.segment == b.segment == 0 and session.prefix_breaks == 0
    head = a.prompt_ids + a.response_ids
    assert b.prompt_ids[:len(head)] == head and tok.decode(b.prompt_ids[len(head):]) == TOOL_TURN
    assert tok.decode(b.response_ids) == ANSWER + "<|im_end|>" and not b.invalid


def test_openai_client_tool_call_round_trip(openai_policy):
    """The plain client gets ``tool_calls`` (finish_reason ``tool_calls``), runs calc, sends the ``tool`` message
    and gets the text answer; 2 turns, one segment."""
    tok = openai_policy.tokenizer
    out, s, engine, calls, fmt = _played(openai_policy, run_openai)
    first, second = out["first"], out["second"]
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "calc" and json.loads(call.function.arguments) == \
        CALC_ARGS
    assert calls == [CALC_ARGS] and out["messages"][-1] == {"role": "tool", "tool_call_id": call.id, "content": "4"}
    assert second is not None and second.choices[0].message.content == ANSWER
    assert not second.choices[0].message.tool_calls and second.choices[0].finish_reason == "stop"
    _check_turns(s, engine, tok, fmt.render_call("calc", CALC_ARGS))


def test_openai_responses_api_function_call_round_trip(openai_policy):
    """The same policy through the Responses API: a ``function_call`` item, its ``function_call_output`` sent after
    ``previous_response_id``, the answer as ``output_text``. The gateway renders the same prompts as for chat
    completions (the turns' ids are the chat test's: the policy was tuned on those), 2 turns, one segment."""
    tok = openai_policy.tokenizer
    out, s, engine, calls, fmt = _played(openai_policy, run_openai_responses)
    (item,) = out["first"].output
    assert item.type == "function_call" and item.name == "calc" and json.loads(item.arguments) == CALC_ARGS
    assert item.call_id.startswith("call_") and calls == [CALC_ARGS]
    assert out["second"] is not None and out["second"].output_text == ANSWER
    assert [o.type for o in out["second"].output] == ["message"]
    _check_turns(s, engine, tok, fmt.render_call("calc", CALC_ARGS))
    _, chat, _, _, _ = _played(openai_policy, run_openai)
    assert [(t.prompt_ids, t.response_ids) for t in s.turns] == [(t.prompt_ids, t.response_ids) for t in chat.turns]


def test_langgraph_react_agent_tool_call_round_trip(langgraph_policy):
    """LangGraph's ReAct agent: the model node gets a ``tool_calls`` AIMessage, the tool node runs calc and answers
    with a ``ToolMessage`` carrying the call's id, the model node's second call gives the final text; 2 turns, one
    segment (langchain-openai sends the reply back as returned). Streamed, the same."""
    tok = langgraph_policy.tokenizer
    out, s, engine, calls, fmt = _played(langgraph_policy, run_langgraph)
    human, ai_call, tool_msg, final = out["messages"]
    assert human.type == "human" and ai_call.type == "ai" and tool_msg.type == "tool" and final.type == "ai"
    (call,) = ai_call.tool_calls
    assert call["name"] == "calc" and call["args"] == CALC_ARGS and call["id"].startswith("call_")
    assert calls == [CALC_ARGS] and tool_msg.tool_call_id == call["id"] and tool_msg.content == "4"
    assert final.content == ANSWER and not final.tool_calls
    assert final.response_metadata["finish_reason"] == "stop"
    _check_turns(s, engine, tok, fmt.render_call("calc", CALC_ARGS))
    # streamed (server-sent events): the same round trip, the same recorded ids
    out, streamed, _, calls, _ = _played(langgraph_policy, lambda *a: run_langgraph(*a, streaming=True))
    assert calls == [CALC_ARGS] and out["messages"][-1].content == ANSWER
    assert out["messages"][1].tool_calls[0]["args"] == CALC_ARGS
    assert [(t.prompt_ids, t.response_ids) for t in streamed.turns] == \
        [(t.prompt_ids, t.response_ids) for t in s.turns]


def test_smolagents_tool_calling_agent_round_trip(smolagents_policy):
    """smolagents' ``ToolCallingAgent`` sends ``tool_choice="required"``: every reply is a call, the gateway writes
    the call's opening after the prompt, and the final answer is a call of its ``final_answer`` tool. It gets the calc
    call, runs it with the call's arguments and ends on ``final_answer("4")``: 2 turns, both valid calls. It does not
    send the reply back as returned: its history holds the call as assistant text (``Calling tools:`` and the call
    with the id the gateway gave it, no ``tool_calls``) and the result as a user ``Observation:`` message, so its
    second call is a prefix break (``reply_rewritten``) and starts segment 1, rendered whole: the same system and task
    ids as the first prompt, then the rewritten call and the result."""
    tok = smolagents_policy.tokenizer
    out, s, engine, calls, fmt = _played(smolagents_policy, run_smolagents)
    assert calls == [CALC_ARGS] and str(out.result) == ANSWER
    steps = [m for m in out.memory.steps if type(m).__name__ == "ActionStep"]
    assert [[(c.name, c.arguments) for c in st.tool_calls] for st in steps] == \
        [[("calc", CALC_ARGS)], [("final_answer", {"answer": ANSWER})]]
    assert [st.observations for st in steps] == ["4", "4"]
    _check_sampled(s, engine)
    a, b = s.turns
    opening = call_opening(fmt, None)
    n_opening = len(tok.encode(opening, add_special_tokens=False))
    assert tok.decode(a.prompt_ids[-n_opening:]) == tok.decode(b.prompt_ids[-n_opening:]) == opening  # forced calls
    assert opening + tok.decode(a.response_ids) == fmt.render_call("calc", CALC_ARGS)
    assert opening + tok.decode(b.response_ids) == fmt.render_call("final_answer", {"answer": ANSWER})
    assert not a.invalid and not b.invalid
    assert (a.segment, b.segment) == (0, 1) and s.breaks == {"reply_rewritten": 1}
    n = len(a.prompt_ids) - n_opening
    assert b.prompt_ids[:n] == a.prompt_ids[:n]  # system prompt and task, rendered alike
    call_id = steps[0].tool_calls[0].id
    assert call_id.startswith("call_") and tok.decode(b.prompt_ids[n:]) == (
        f"Calling tools:\n[{{'id': '{call_id}', 'type': 'function', 'function': {{'name': 'calc', 'arguments': "
        f"{{'expression': '2+2'}}}}}}]<|im_end|>\n<|im_start|>user\nObservation:\n4<|im_end|>\n"
        f"<|im_start|>assistant\n{opening}")


def _sdk_round_trip(out: dict[str, Any], calls: list[dict[str, Any]]) -> None:
    """The SDK's run: a calc call item, its output ``4``, the final message ``4``; calc ran once with the call's
    arguments; only the loopback was looked up."""
    result = out["result"]
    assert calls == [CALC_ARGS] and result.final_output == ANSWER
    assert [item.type for item in result.new_items] == ["tool_call_item", "tool_call_output_item",
                                                        "message_output_item"]
    call, output, _ = result.new_items
    assert call.raw_item.name == "calc" and json.loads(call.raw_item.arguments) == CALC_ARGS
    assert call.raw_item.call_id.startswith("call_") and output.output == ANSWER
    assert output.raw_item["call_id"] == call.raw_item.call_id
    assert set(out["hosts"]) <= {"127.0.0.1"}


def test_agents_sdk_responses_model_tool_call_round_trip(agents_sdk_policy):
    """The OpenAI Agents SDK's ``Agent`` over ``OpenAIResponsesModel`` (its default API): it gets a
    ``function_call`` item, runs calc, and its second request sends the whole history as input items (the user
    message, the ``function_call`` item as returned, its ``function_call_output``; no ``previous_response_id``),
    which the gateway turns back into the conversation it recorded: 2 turns, one segment, no prefix break. It sends
    ``include: []`` and no sampling fields; the function tool's ``strict: true`` is rendered with the tool (the same
    prompt as over chat completions, below). Streamed (``Runner.run_streamed``), the same recorded ids."""
    tok = agents_sdk_policy.tokenizer
    out, s, engine, calls, fmt = _played(agents_sdk_policy, run_agents_sdk)
    _sdk_round_trip(out, calls)
    (path1, first), (path2, second) = out["requests"]
    assert path1 == path2 == "/v1/responses"
    assert set(first) == set(second) == {"model", "include", "input", "instructions", "tools"}
    assert first["include"] == [] and first["instructions"] == "Use the calc tool for arithmetic."
    (tool,) = first["tools"]
    assert (tool["type"], tool["name"], tool["strict"]) == ("function", "calc", True)
    assert first["input"] == [{"role": "user", "content": QUESTION}]
    user, call, output = second["input"]
    assert user == first["input"][0] and call["type"] == "function_call" and call["name"] == "calc"
    assert json.loads(call["arguments"]) == CALC_ARGS and call["id"].startswith("fc_")
    assert output == {"type": "function_call_output", "call_id": call["call_id"], "output": ANSWER}
    ids = [r.response_id for r in out["result"].raw_responses]
    assert len(ids) == len(set(ids)) == 2 and all(i.startswith("resp_") for i in ids)
    _check_turns(s, engine, tok, fmt.render_call("calc", CALC_ARGS))
    # streamed (server-sent events): the same round trip, the same recorded ids
    out, streamed, _, calls, _ = _played(agents_sdk_policy, lambda *a: run_agents_sdk(*a, streamed=True))
    _sdk_round_trip(out, calls)
    assert [body.get("stream") for _, body in out["requests"]] == [True, True]
    assert [(t.prompt_ids, t.response_ids) for t in streamed.turns] == \
        [(t.prompt_ids, t.response_ids) for t in s.turns]


def test_agents_sdk_auto_previous_response_id_round_trip(agents_sdk_policy):
    """The SDK with ``auto_previous_response_id=True``: its second request names the first response
    (``previous_response_id``) and sends only the ``function_call_output``; the gateway's stored conversation gives
    the same prompt, so the same recorded ids as the whole-history run, one segment."""
    tok = agents_sdk_policy.tokenizer
    out, s, engine, calls, fmt = _played(agents_sdk_policy, lambda *a: run_agents_sdk(*a, chained=True))
    _sdk_round_trip(out, calls)
    (_, first), (_, second) = out["requests"]
    assert "previous_response_id" not in first
    assert second["previous_response_id"] == out["result"].raw_responses[0].response_id
    (output,) = second["input"]
    assert output["type"] == "function_call_output" and output["output"] == ANSWER
    _check_turns(s, engine, tok, fmt.render_call("calc", CALC_ARGS))
    _, whole, _, _, _ = _played(agents_sdk_policy, run_agents_sdk)
    assert [(t.prompt_ids, t.response_ids) for t in s.turns] == [(t.prompt_ids, t.response_ids) for t in whole.turns]


def test_agents_sdk_chat_completions_model_tool_call_round_trip(agents_sdk_policy):
    """The same agent over ``OpenAIChatCompletionsModel``: ``tool_calls`` back, the tool message sent, the answer
    ``4``; its instructions become the system message and its tool (``strict`` inside ``function``) renders as over
    the Responses API, so the recorded ids are the Responses run's (the policy was tuned on those), one segment."""
    tok = agents_sdk_policy.tokenizer
    out, s, engine, calls, fmt = _played(agents_sdk_policy, lambda *a: run_agents_sdk(*a, api="chat"))
    _sdk_round_trip(out, calls)
    (path1, first), (path2, second) = out["requests"]
    assert path1 == path2 == "/v1/chat/completions"
    assert set(first) == set(second) == {"model", "messages", "tools"}
    assert first["messages"] == [{"role": "system", "content": "Use the calc tool for arithmetic."},
                                 {"role": "user", "content": QUESTION}]
    assert first["tools"][0]["function"]["strict"] is True
    system, user, assistant, tool = second["messages"]
    assert (system, user) == tuple(first["messages"]) and assistant["role"] == "assistant"
    (call,) = assistant["tool_calls"]
    assert call["function"]["name"] == "calc" and json.loads(call["function"]["arguments"]) == CALC_ARGS
    assert tool == {"role": "tool", "tool_call_id": call["id"], "content": ANSWER}
    _check_turns(s, engine, tok, fmt.render_call("calc", CALC_ARGS))
    _, responses, _, _, _ = _played(agents_sdk_policy, run_agents_sdk)
    assert [(t.prompt_ids, t.response_ids) for t in s.turns] == \
        [(t.prompt_ids, t.response_ids) for t in responses.turns]


def test_agents_sdk_follow_up_run_extends_the_segment(agents_sdk_policy):
    """A second ``Runner.run_sync`` on ``result.to_input_list()`` and a new user message (how the SDK continues a
    conversation): its request sends the whole history back as items, the final answer as an assistant ``message``
    item (an ``output_text`` part with its ``annotations``, the item's ``id`` and ``status``), which the gateway
    reads as the reply it returned: the third call extends the same segment (its prompt is the second call's prompt
    and sampled answer, then only the new user turn)."""
    tok = agents_sdk_policy.tokenizer
    out, s, engine, calls, _ = _played(agents_sdk_policy,
                                       lambda *a: run_agents_sdk(*a, follow_up="And 3+3?"))
    assert calls[:1] == [CALC_ARGS] and out["result"].final_output == ANSWER and set(out["hosts"]) <= {"127.0.0.1"}
    _, _, (_, third) = out["requests"][:3]
    kinds = [item.get("type", "message") for item in third["input"]]
    assert kinds == ["message", "function_call", "function_call_output", "message", "message"]
    answer, follow = third["input"][3:]
    assert answer["role"] == "assistant" and answer["id"].startswith("msg_") and answer["status"] == "completed"
    assert answer["content"] == [{"type": "output_text", "text": ANSWER, "annotations": []}]
    assert follow == {"role": "user", "content": "And 3+3?"}
    _check_sampled(s, engine)
    assert len(s.turns) >= 3 and s.prefix_breaks == 0 and {t.segment for t in s.turns} == {0}
    b, c = s.turns[1:3]
    head = b.prompt_ids + b.response_ids
    assert c.prompt_ids[:len(head)] == head
    assert tok.decode(c.prompt_ids[len(head):]) == "\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"


def _system_turn(tok, turn) -> tuple[str, str]:
    """A turn's prompt text split before its first user message: ``(system turn with the tools, the rest)``."""
    text = tok.decode(turn.prompt_ids)
    at = text.index("<|im_start|>user\n")
    return text[:at], text[at:]


USER_TURN = f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"


def test_agents_sdk_handoff_is_a_tools_changed_break(agents_sdk_handoff_policy):
    """A triage ``Agent`` with ``handoffs=[specialist]``: the policy calls ``transfer_to_specialist`` (arguments
    ``{}``), the SDK switches agents, the specialist calls calc and answers ``4``; ``result.last_agent`` is the
    specialist. The specialist's requests send its own instructions and tools (calc; the transfer tool is gone) and
    the whole history: the user message, the transfer call as returned and its output ``{"assistant":
    "specialist"}``. So the second call is one prefix break, ``tools_changed`` (the tools are compared before the
    messages; its system message differs too), and starts segment 1, rendered whole: the specialist's system turn,
    then the same user turn, the transfer call (the ids the policy sampled) and its output. The third call extends
    segment 1: 3 turns, segments 0, 1, 1, each as sampled."""
    tok = agents_sdk_handoff_policy.tokenizer
    out, s, engine, calls, fmt = _played(agents_sdk_handoff_policy, run_agents_sdk_team)
    result = out["result"]
    assert calls == [CALC_ARGS] and result.final_output == ANSWER
    assert result.last_agent is out["agents"]["specialist"] and set(out["hosts"]) <= {"127.0.0.1"}
    assert [item.type for item in result.new_items] == ["handoff_call_item", "handoff_output_item", "tool_call_item",
                                                        "tool_call_output_item", "message_output_item"]
    handoff, handed, call, output, _ = result.new_items
    assert handoff.raw_item.name == "transfer_to_specialist" and json.loads(handoff.raw_item.arguments) == {}
    assert (handed.source_agent.name, handed.target_agent.name) == ("triage", "specialist")
    assert handed.raw_item["output"] == '{"assistant": "specialist"}'
    assert handed.raw_item["call_id"] == handoff.raw_item.call_id
    assert call.agent.name == "specialist" and json.loads(call.raw_item.arguments) == CALC_ARGS
    assert output.output == ANSWER
    # what the SDK sent: the triage agent's request, then the specialist's two
    bodies = [body for _, body in out["requests"]]
    assert [path for path, _ in out["requests"]] == ["/v1/responses"] * 3
    assert [b["instructions"] for b in bodies] == [TRIAGE, SPECIALIST, SPECIALIST]
    assert [[t["name"] for t in b["tools"]] for b in bodies] == [["transfer_to_specialist"], ["calc"], ["calc"]]
    user, transfer, handed_out = bodies[1]["input"]
    assert user == {"role": "user", "content": QUESTION} and transfer["name"] == "transfer_to_specialist"
    assert handed_out == {"type": "function_call_output", "call_id": transfer["call_id"],
                          "output": '{"assistant": "specialist"}'}
    assert bodies[2]["input"][:3] == bodies[1]["input"]
    # what the gateway recorded
    _check_sampled(s, engine)
    a, b, c = s.turns
    assert [t.segment for t in s.turns] == [0, 1, 1] and s.prefix_breaks == 1 and s.breaks == {"tools_changed": 1}
    assert not (a.invalid or b.invalid or c.invalid)
    transfer_call = fmt.render_call("transfer_to_specialist", {})
    assert tok.decode(a.response_ids) == transfer_call and tok.decode(b.response_ids) == fmt.render_call(
        "calc", CALC_ARGS) and tok.decode(c.response_ids) == ANSWER + "<|im_end|>"
    system_a, rest_a = _system_turn(tok, a)
    system_b, rest_b = _system_turn(tok, b)
    assert TRIAGE in system_a and '"name": "transfer_to_specialist"' in system_a and '"name": "calc"' not in system_a
    assert SPECIALIST in system_b and '"name": "calc"' in system_b and "transfer_to_specialist" not in system_b
    assert rest_a == USER_TURN and rest_b == USER_TURN + transfer_call + \
        '<|im_end|>\n<|im_start|>tool\n{"assistant": "specialist"}<|im_end|>\n<|im_start|>assistant\n'
    n = len(a.response_ids)
    assert any(b.prompt_ids[i:i + n] == a.response_ids for i in range(len(b.prompt_ids)))  # the call as sampled
    head = b.prompt_ids + b.response_ids
    assert c.prompt_ids[:len(head)] == head and tok.decode(c.prompt_ids[len(head):]) == TOOL_TURN


def test_agents_sdk_agent_as_tool_calls_are_three_segments(agents_sdk_as_tool_policy):
    """The specialist as the triage agent's tool (``specialist.as_tool("ask_specialist", ...)``): the policy calls
    ``ask_specialist({"input": "2+2"})``, the SDK runs the specialist on ``2+2`` (its own instructions, calc, a fresh
    history: one user message), which calls calc and answers ``4``, the tool's output; the triage agent then answers
    ``4`` and is ``result.last_agent``. One episode of 4 turns: the nested run's first call changes the tools
    (segment 1, rendered whole), its second extends it, and the triage agent's second call changes them back: a
    second ``tools_changed`` break, segment 2, although its ids are exactly segment 0's prompt and call then the
    tool turn (a request is compared with the current segment only): segments 0, 1, 1, 2, each turn as sampled."""
    tok = agents_sdk_as_tool_policy.tokenizer
    out, s, engine, calls, fmt = _played(agents_sdk_as_tool_policy, run_agents_sdk_as_tool)
    result = out["result"]
    assert calls == [CALC_ARGS] and result.final_output == ANSWER
    assert result.last_agent is out["agents"]["triage"] and set(out["hosts"]) <= {"127.0.0.1"}
    assert [item.type for item in result.new_items] == ["tool_call_item", "tool_call_output_item",
                                                        "message_output_item"]
    call, output, _ = result.new_items
    assert call.raw_item.name == "ask_specialist" and json.loads(call.raw_item.arguments) == ASK_ARGS
    assert output.output == ANSWER
    bodies = [body for _, body in out["requests"]]
    assert [b["instructions"] for b in bodies] == [TRIAGE, SPECIALIST, SPECIALIST, TRIAGE]
    assert [[t["name"] for t in b["tools"]] for b in bodies] == [["ask_specialist"], ["calc"], ["calc"],
                                                                 ["ask_specialist"]]
    assert bodies[1]["input"] == [{"role": "user", "content": ASK_ARGS["input"]}]
    user, ask, answered = bodies[3]["input"]
    assert user == {"role": "user", "content": QUESTION} and ask["name"] == "ask_specialist"
    assert answered == {"type": "function_call_output", "call_id": ask["call_id"], "output": ANSWER}
    _check_sampled(s, engine)
    a, b, c, d = s.turns
    assert [t.segment for t in s.turns] == [0, 1, 1, 2] and s.prefix_breaks == 2 and s.breaks == {"tools_changed": 2}
    assert not any(t.invalid for t in s.turns)
    assert tok.decode(a.response_ids) == fmt.render_call("ask_specialist", ASK_ARGS)
    assert tok.decode(b.response_ids) == fmt.render_call("calc", CALC_ARGS)
    assert tok.decode(c.response_ids) == tok.decode(d.response_ids) == ANSWER + "<|im_end|>"
    system_b, rest_b = _system_turn(tok, b)
    assert SPECIALIST in system_b and rest_b == "<|im_start|>user\n2+2<|im_end|>\n<|im_start|>assistant\n"
    head = b.prompt_ids + b.response_ids
    assert c.prompt_ids[:len(head)] == head and tok.decode(c.prompt_ids[len(head):]) == TOOL_TURN
    head = a.prompt_ids + a.response_ids  # the triage agent's own conversation, rendered whole: the same ids
    assert d.prompt_ids[:len(head)] == head and tok.decode(d.prompt_ids[len(head):]) == TOOL_TURN
