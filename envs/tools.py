"""Tool calls as env actions (``action_format="tools"``): the declaration, the action encoding, the validation.

An env that offers tools takes ``action_format="tools"`` in its constructor; it then declares them as its ``tools``
attribute (on the unwrapped env) and in reset's ``info["tools"]``: a list of OpenAI-style function schemas (the
shape chat templates take as ``tools=``, and MCP's ``tools/list`` maps from)::

    {"type": "function", "function": {"name": "calc", "description": "...",
                                      "parameters": {"type": "object", "properties": {...}, "required": [...]}}}

Its ``step`` then takes one ``str`` action in this encoding (the same in-process, over HTTP and behind MCP):

- a tool call: the JSON object ``{"name": <tool>, "arguments": {...}}`` (:func:`encode_call`);
- a call the caller could not read (the model wrote a tool call that is not JSON, has no name, ...): the JSON
  object ``{"invalid_tool_call": <reason>, "text": <what was written>}`` (:func:`encode_invalid`); the env answers it
  as an invalid action with the reason;
- anything else: a plain text reply, the model's answer without a tool call (math's final answer, for example).

:func:`decode_action` turns an action back into a :class:`ToolCall` (None for a text reply) and checks it against
the declared tools: an unknown tool or arguments that do not validate against the tool's JSON schema (``jsonschema``)
raise :class:`ToolCallError` with the reason, which the env puts in its next observation and flags with
``info["invalid_action"] = True`` (never an exception out of ``step``). docs/tools.md has the whole picture.

This module imports nothing from ``agent_rl`` (envs never do).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from envs.jsondepth import MAX_JSON_DEPTH, JSONTooDeep, loads_bounded

__all__ = ["ACTION_FORMATS", "PYTHON_TOOL", "TOOLS_BY_NAME", "ToolCall", "ToolCallError", "check_action_format",
           "command_tool", "decode_action", "encode_call", "encode_invalid", "function_tool", "invalid_call_text",
           "named_tools", "require_call", "run_python", "task_tool_step", "tool_names"]

ACTION_FORMATS = ("text", "tools")
"""``text``: the env's own text commands (``go to desk 1``, ``search[...]``); ``tools``: tool calls in this
module's encoding."""

INVALID_KEY = "invalid_tool_call"


class ToolCallError(ValueError):
    """A tool call the env cannot run: not readable, an unknown tool, or arguments its schema refuses. The message
    is the reason (it goes into the env's next observation)."""


@dataclass(frozen=True)
class ToolCall:
    """One decoded call: the tool's ``name`` and its ``arguments`` (validated against the tool's schema)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def check_action_format(action_format: str) -> str:
    """``action_format`` if it is one of :data:`ACTION_FORMATS`, else ``ValueError`` naming the valid values."""
    if action_format not in ACTION_FORMATS:
        raise ValueError(f"action_format must be one of {', '.join(ACTION_FORMATS)}, got {action_format!r}")
    return action_format


def function_tool(name: str, description: str, properties: dict[str, dict[str, Any]],
                  required: Sequence[str] | None = None) -> dict[str, Any]:
    """An OpenAI-style function schema: ``{"type": "function", "function": {name, description, parameters}}`` with
    ``parameters`` an object schema of ``properties`` (every one required unless ``required`` says otherwise) that
    refuses unknown argument names."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": dict(properties),
                       "required": list(properties) if required is None else list(required),
                       "additionalProperties": False}}}


def tool_names(tools: Sequence[dict[str, Any]]) -> list[str]:
    """The function names of ``tools`` (schemas as :func:`function_tool` makes them, or bare ``{"name", ...}``)."""
    return [str((t.get("function") or t).get("name")) for t in tools]


def _schema_of(tools: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
    for t in tools:
        fn = t.get("function") or t
        if fn.get("name") == name:
            return fn.get("parameters") or {"type": "object"}
    return None


def encode_call(name: str, arguments: dict[str, Any] | None = None) -> str:
    """The action text of a call to ``name`` with ``arguments`` (ASCII JSON: it fits any text space)."""
    return json.dumps({"name": name, "arguments": dict(arguments or {})}, ensure_ascii=True)


def encode_invalid(reason: str, text: str = "") -> str:
    """The action text of a call that could not be read (``reason``: why; ``text``: what the model wrote)."""
    return json.dumps({INVALID_KEY: reason, "text": text}, ensure_ascii=True)


def decode_action(action: str, tools: Sequence[dict[str, Any]]) -> ToolCall | None:
    """The call that ``action`` encodes, checked against ``tools``; None when ``action`` is a plain text reply.

    Raises:
        ToolCallError: an :func:`encode_invalid` action (its reason), JSON nested deeper than
            :data:`envs.jsondepth.MAX_JSON_DEPTH` (refused before parsing, valid or not: a call that cannot be
            read), a JSON object without a string ``name``, ``arguments`` that are not an object, an unknown tool
            (names the declared ones), or arguments the tool's JSON schema refuses (the validator's message). Never
            anything else: whatever the text, a call that cannot be read is this error, never an env failure.
    """
    text = action.strip()
    if not text.startswith("{"):
        return None
    try:
        obj = loads_bounded(text, MAX_JSON_DEPTH, "the tool call")
    except JSONTooDeep as exc:
        raise ToolCallError(str(exc)) from None
    except ValueError:
        return None  # text that merely starts with a brace is a reply, not a call
    if not isinstance(obj, dict):
        return None
    if INVALID_KEY in obj:
        raise ToolCallError(str(obj[INVALID_KEY]))
    if "name" not in obj:
        return None
    name, arguments = obj.get("name"), obj.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise ToolCallError(f"the call's name must be a non-empty string, got {name!r}")
    if isinstance(arguments, str):  # some models write the arguments as a JSON string (OpenAI's wire format)
        try:
            where = f"the arguments of {name}"
            arguments = loads_bounded(arguments, MAX_JSON_DEPTH, where) if arguments.strip() else {}
        except ValueError as exc:
            raise ToolCallError(f"the arguments of {name} are not JSON ({exc})") from None
    if not isinstance(arguments, dict):
        raise ToolCallError(f"the arguments of {name} must be a JSON object, got {type(arguments).__name__}")
    schema = _schema_of(tools, name)
    if schema is None:
        raise ToolCallError(f"unknown tool {name!r}; the tools are: {', '.join(tool_names(tools)) or '(none)'}")
    import jsonschema  # deferred: only tool envs need it

    validator = jsonschema.Draft202012Validator(schema)
    try:
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    except RecursionError:  # a declared schema that recurses (the arguments are bounded above)
        raise ToolCallError(f"the arguments of {name} could not be checked (too deeply nested)") from None
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.absolute_path)
        raise ToolCallError(f"wrong arguments for {name}: {first.message}" + (f" (at {where})" if where else ""))
    return ToolCall(name, arguments)


def require_call(action: str, tools: Sequence[dict[str, Any]]) -> ToolCall:
    """:func:`decode_action` for envs whose every turn is a tool call: a text reply raises :class:`ToolCallError`
    too ("calls no tool")."""
    call = decode_action(action, tools)
    if call is None:
        raise ToolCallError(f"the reply calls no tool; answer with one call of: {', '.join(tool_names(tools))}")
    return call


def invalid_call_text(error: ToolCallError | str) -> str:
    """The observation of an invalid call: ``"Invalid tool call: <reason>"``."""
    return f"Invalid tool call: {error}"


def command_tool(description: str) -> dict[str, Any]:
    """The one tool of a text game (ALFWorld, TextWorld): ``act(command: str)`` plays ``command``."""
    return function_tool("act", description,
                         {"command": {"type": "string", "description": "the command, one of the admissible actions"}})


# ----------------------------------------------------------------------------------------------- python tool
PYTHON_TOOL = function_tool(
    "python", "Run a Python 3 program in a sandbox (no network, no files kept between calls) and get back what it "
    "prints (stdout, then stderr). Print the values you need.",
    {"code": {"type": "string", "description": "the complete program to run"}})
"""The ``python`` tool of math and code (``env.tools=[python]``)."""


TOOLS_BY_NAME = {"python": PYTHON_TOOL}
"""The tools a task env (math, code) can be given by name (``tools=["python"]``, config ``env.tools``)."""


def named_tools(action_format: str, names: Sequence[str]) -> list[dict[str, Any]]:
    """The schemas of ``names`` (keys of :data:`TOOLS_BY_NAME`) for an env made with ``action_format``.

    Raises:
        ValueError: an unknown name (lists the valid ones), or tools asked for with ``action_format="text"``.
    """
    check_action_format(action_format)
    names = [names] if isinstance(names, str) else list(names or [])
    unknown = sorted(set(names) - set(TOOLS_BY_NAME))
    if unknown:
        raise ValueError(f"unknown tools {unknown}; valid: {sorted(TOOLS_BY_NAME)}")
    if names and action_format != "tools":
        raise ValueError(f"tools={names} need action_format='tools' (got {action_format!r})")
    return [TOOLS_BY_NAME[n] for n in dict.fromkeys(names)]


def task_tool_step(action: str, tools: Sequence[dict[str, Any]],
                   limits: Any = None) -> tuple[str, dict[str, Any]] | None:
    """One turn of a task env with tools (math, code): None when ``action`` is a text reply (the final answer, for
    the env to grade); else ``(observation, info)`` of the tool call (``python``: the program's output; info
    ``tool``, ``tool_ok``, ``invalid_action=False``) or of an invalid call (``Invalid tool call: <reason>``, info
    ``invalid_action=True``, ``tool_error``). The episode goes on in both cases.

    Raises:
        EnvInfraError: the sandbox could not run the program (:func:`run_python`).
    """
    if not tools:
        return None
    try:
        call = decode_action(action, tools)
    except ToolCallError as exc:
        return invalid_call_text(exc), {"invalid_action": True, "tool_error": str(exc)}
    if call is None:
        return None
    output, ok = run_python(call.arguments["code"], limits)  # "python" is the one tool of TOOLS_BY_NAME
    return output, {"invalid_action": False, "tool": call.name, "tool_ok": ok}


def run_python(code: str, limits: Any = None, max_chars: int = 2000) -> tuple[str, bool]:
    """Run ``code`` in the code sandbox (``envs.code.sandbox.run_tests``, no tests: only the program's top level)
    and return ``(output, ok)``: its stdout, then its stderr and the error that stopped it, cut to ``max_chars``;
    ``ok`` is False when the program raised, timed out or was killed.

    Raises:
        EnvInfraError: the sandbox could not run the program at all (``envs.code.sandbox.raise_if_infra``).
    """
    from envs.code.sandbox import SandboxLimits, raise_if_infra, run_tests  # deferred: sandbox start-up code

    if limits is None:
        limits = SandboxLimits(wall_s=10.0, cpu_s=5, load_timeout_s=5.0)
    elif isinstance(limits, dict):
        limits = SandboxLimits(**limits)
    result = run_tests(code, {"mode": "asserts", "setup": "", "asserts": []}, limits)
    raise_if_infra(result)
    parts = [result.stdout]
    if result.stderr:
        parts.append(result.stderr)
    ok = result.load_error is None and not result.timed_out
    if result.load_error is not None:
        kind, message = result.load_error[0], result.load_error[1]
        parts.append(f"{kind}: {message}")
    elif result.timed_out:
        parts.append("Timed out.")
    out = "\n".join(p.rstrip("\n") for p in parts if p).strip("\n")
    if result.stdout_bytes > len(result.stdout.encode("utf-8", errors="replace")):
        out += "\n[output cut]"
    if len(out) > max_chars:
        out = out[:max_chars] + "\n[output cut]"
    return (out if out else "(no output)"), ok
