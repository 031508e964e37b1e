"""Native tool calls (``env.action_format=tools``): how each model family writes a call, read back into an env action.

A model family's *tool-call format* (``model.tool_call_format``, one registry, :func:`register_tool_call_format`)
says how its model writes a call and how tools are described to it when its chat template cannot:

- ``hermes`` (Qwen2.5, Qwen3, Hermes, SmolLM2): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
  (a JSON list of such objects inside one block is read too, as SmolLM2 was trained to write); generation stops at
  ``</tool_call>``, so one call per turn;
- ``llama3_json`` (Llama 3.1/3.2/3.3): ``{"name": ..., "parameters": {...}}`` (``arguments`` accepted too),
  optionally after ``<|python_tag|>``; several calls separated by ``;`` or newlines, or beside prose, are read
  (rules: :class:`Llama3JsonFormat`).

:meth:`ToolCallFormat.parse` gives a :class:`ToolCallParse` (the calls, the text around them, or why a call the
model started cannot be read: bad JSON, no name, ...); :attr:`ToolCallParse.action` is the env action in the
``envs.tools`` encoding (the first call; an unreadable call as ``encode_invalid``; a reply without a call as its
text). The env checks the call against its tools and answers an unknown tool or wrong arguments as an invalid
action with the reason (``envs.tools.decode_action``).

:class:`TemplateTools` says what a tokenizer's chat template can show: a ``tools=`` branch (else the tools go into
the system prompt, in the format's own words: never silently dropped), assistant ``tool_calls`` (else a past call is
written as the model would write it, in the message's content) and the ``tool`` role (else the env's answer is a
user message). Rules of the whole path: docs/tools.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from envs.tools import encode_call, encode_invalid

ToolSchema = dict[str, Any]


@dataclass(frozen=True)
class ToolCallParse:
    """What a model reply holds. ``calls``: ``(name, arguments)`` in order; ``content``: the reply without its
    calls (stripped); ``error``: why a call the reply started cannot be read (None when every call was read)."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    content: str = ""
    error: str | None = None
    text: str = ""

    @property
    def action(self) -> str:
        """The env action (``envs.tools`` encoding): the first call; an unreadable call as
        ``encode_invalid(error, text)``; a reply without a call as its text."""
        if self.error is not None:
            return encode_invalid(self.error, self.text.strip())
        if self.calls:
            name, arguments = self.calls[0]
            return encode_call(name, arguments)
        return self.text.strip()

    @property
    def well_formed(self) -> bool:
        """Every call the reply started could be read (a reply without a call is well formed: math's answer)."""
        return self.error is None


class ToolCallFormat(Protocol):
    """One model family's way of writing tool calls."""

    name: str
    stop: tuple[str, ...]
    """Stop strings of generation in tools mode (the end of one call)."""
    markup: tuple[str, ...]
    """The strings that mark a call (``<tool_call>``...): a tokenizer may hold them as special tokens, which a
    decode without special tokens drops, so replies are decoded for parsing with them kept
    (:func:`decode_for_parsing`)."""

    def parse(self, text: str) -> ToolCallParse: ...

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        """A call as the model writes it (a past call, for templates that cannot show ``tool_calls``)."""
        ...

    def system_prompt(self, tools: Sequence[ToolSchema]) -> str:
        """The tools and how to call them, for templates without a ``tools=`` branch."""
        ...


_FORMATS: dict[str, Callable[[], ToolCallFormat]] = {}


def register_tool_call_format(name: str) -> Callable[[Callable[[], ToolCallFormat]], Callable[[], ToolCallFormat]]:
    """Decorator registering a :class:`ToolCallFormat` factory under ``name`` (a duplicate raises ``ValueError``)."""

    def deco(factory: Callable[[], ToolCallFormat]) -> Callable[[], ToolCallFormat]:
        if name in _FORMATS:
            raise ValueError(f"tool-call format {name!r} is already registered")
        _FORMATS[name] = factory
        return factory

    return deco


def tool_call_format_names() -> list[str]:
    return sorted(_FORMATS)


def get_tool_call_format(name: str) -> ToolCallFormat:
    """The format registered as ``name``; ``ValueError`` lists the valid names (``model.tool_call_format``)."""
    if name not in _FORMATS:
        raise ValueError(f"unknown tool-call format {name!r} (model.tool_call_format); "
                         f"valid: {tool_call_format_names()}")
    return _FORMATS[name]()


def _json_error(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg} at line {exc.lineno} column {exc.colno}"


def _read_call(obj: Any, arguments_keys: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """``(name, arguments)`` of one decoded call object; ``ValueError`` with the reason otherwise."""
    if not isinstance(obj, dict):
        raise ValueError(f"a call must be a JSON object {{\"name\": ..., \"{arguments_keys[0]}\": {{...}}}}, "
                         f"got a {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"the call has no \"name\" string (keys: {sorted(obj)[:8]})")
    arguments: Any = {}
    for key in arguments_keys:
        if key in obj:
            arguments = obj[key]
            break
    if isinstance(arguments, str):  # OpenAI's wire format: arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"the arguments of {name} are a string that is not JSON ({_json_error(exc)})") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments of {name} must be a JSON object, got a {type(arguments).__name__}")
    return name, arguments


def _tools_json(tools: Sequence[ToolSchema], indent: int | None = None) -> str:
    return "\n".join(json.dumps(t, ensure_ascii=False, indent=indent) for t in tools)


class HermesFormat:
    """``<tool_call>{json}</tool_call>`` (Hermes 2 Pro, Qwen2.5/Qwen3, SmolLM2). Rules as vLLM's ``hermes`` parser:
    every ``<tool_call>...</tool_call>`` block, and a last block left open (the reply ran out of tokens)."""

    name = "hermes"
    stop = ("</tool_call>",)
    markup = ("<tool_call>", "</tool_call>")
    _BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)

    def parse(self, text: str) -> ToolCallParse:
        blocks = list(self._BLOCK.finditer(text))
        if not blocks:
            return ToolCallParse(content=text.strip(), text=text)
        gaps = zip([0] + [b.end() for b in blocks], [b.start() for b in blocks] + [len(text)])
        content = "\n".join(piece for a, b in gaps if (piece := text[a:b].strip()))  # the text around the calls
        calls: list[tuple[str, dict[str, Any]]] = []
        for block in blocks:
            payload = (block.group(1) if block.group(1) is not None else block.group(2)).strip()
            if not payload:
                return ToolCallParse(calls, content, "the <tool_call> block is empty", text)
            try:
                obj = json.loads(payload)
            except json.JSONDecodeError as exc:
                unclosed = block.group(1) is None
                return ToolCallParse(calls, content, f"the <tool_call> block is not JSON ({_json_error(exc)})"
                                     + ("; it was never closed with </tool_call>" if unclosed else ""), text)
            try:
                calls += [_read_call(o, ("arguments", "parameters")) for o in (obj if isinstance(obj, list) else [obj])]
            except ValueError as exc:
                return ToolCallParse(calls, content, str(exc), text)
        if not calls:
            return ToolCallParse(calls, content, "the <tool_call> block holds an empty list of calls", text)
        return ToolCallParse(calls, content, None, text)

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + \
            "\n</tool_call>"

    def system_prompt(self, tools: Sequence[ToolSchema]) -> str:
        # The Hermes convention, in the words of Qwen2.5's chat template (Apache-2.0).
        return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
                "with function signatures within <tools></tools> XML tags:\n<tools>\n" + _tools_json(tools) +
                "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call>")


class Llama3JsonFormat:
    """Llama 3.1+ JSON calls: ``{"name": ..., "parameters": {...}}`` (``arguments`` accepted too), optionally after
    ``<|python_tag|>``, the way Llama models write them: one call as the whole reply, several separated by ``;`` or
    on separate lines, a JSON list of calls, calls beside prose (``"Let me look.\n{...}"``, ``"{...}\nThis returns
    {"temp": ...}"``).

    Rules (vLLM's ``llama3_json`` of v0.9 took the first regex match of ``;``-joined objects at most two levels deep
    and answered the whole reply as text on any error, so a call on a second line, or after JSON in prose, was
    lost; this reads every call and says when one is unreadable instead of dropping it):

    - a call is a JSON object with a ``"name"`` string and a ``"parameters"``/``"arguments"`` key, found at any
      ``{`` outside an already-read object; the reply's leading named object (tag aside) is a call even without
      arguments (``{}``), and so is each object of a leading list of named objects;
    - other JSON in prose is text (``{"temp": 21}``, ``\\boxed{18}``), and so are the ``;`` between calls;
    - unreadable (the parse's error, the calls before it kept): a reply that starts (tag aside) with ``{`` but is
      not JSON, or with an object without a name and no call after it (``{"function": "calc", ...}``), a
      ``{"name": ...`` in prose that is not JSON, a call whose arguments are not an object, and ``<|python_tag|>``
      followed by something other than a call (Llama's code-interpreter form).
    """

    name = "llama3_json"
    stop: tuple[str, ...] = ()  # the call ends the turn (<|eot_id|> / <|eom_id|>, the engine's EOS)
    _TAG = "<|python_tag|>"
    markup = (_TAG,)
    _ARGUMENTS = ("parameters", "arguments")
    _STARTED_CALL = re.compile(r'\{\s*"name"\s*:')
    MAX_PROSE_MISSES = 256

    @staticmethod
    def _is_call(obj: Any, arguments_keys: tuple[str, ...]) -> bool:
        return isinstance(obj, dict) and isinstance(obj.get("name"), str) and any(k in obj for k in arguments_keys)

    def parse(self, text: str) -> ToolCallParse:
        """Bounded work on any text: a value read is skipped whole; inside a span that did not decode, and after
        :attr:`MAX_PROSE_MISSES` braces of prose that did not, only a ``{"name":`` is tried (a failed one ends the
        parse), since each failed decode costs up to ``len(text)``."""
        body = text.replace(self._TAG, " ").strip()
        if self._TAG in text and not text.split(self._TAG, 1)[1].lstrip()[:1] in ("{", "["):
            return ToolCallParse(content=body, error="<|python_tag|> is not followed by a JSON call", text=text)
        decoder = json.JSONDecoder()
        calls: list[tuple[str, dict[str, Any]]] = []
        prose: list[str] = []
        last = 0  # the end of the last call read: the text from there to the next call is prose
        skip = 0  # the end of the last JSON value read, call or data: braces before it are inside it
        failed = 0  # the end of the last span that did not decode: only a started call is tried before it
        misses = 0
        unnamed: str | None = None  # why the reply's leading object is not a call
        leading_end = 0

        def parsed(error: str | None = None, upto: int | None = None) -> ToolCallParse:
            if not calls and error is None:
                return ToolCallParse(content=body, text=text)
            pieces = [p.strip(" \t\n;") for p in prose + [body[last:upto]]]
            return ToolCallParse(calls, "\n".join(p for p in pieces if p), error, text)

        starts = ([0] if body.startswith("[") else []) + [m.start() for m in re.finditer(r"\{", body)]
        for start in starts:
            started = self._STARTED_CALL.match(body, start) is not None
            if start < skip or not started and (start < failed or misses >= self.MAX_PROSE_MISSES):
                continue
            try:
                obj, end = decoder.raw_decode(body, start)
            except (json.JSONDecodeError, RecursionError) as exc:
                if (start == 0 and body[0] == "{") or started:
                    reason = _json_error(exc) if isinstance(exc, json.JSONDecodeError) else "nested too deep"
                    return parsed(f"the call is not JSON ({reason})", upto=start)
                failed = max(exc.pos, start + 1) if isinstance(exc, json.JSONDecodeError) else len(body)
                misses += 1
                continue  # a brace in prose (\\boxed{18}, "{x}")
            skip = end
            items = obj if isinstance(obj, list) else [obj]
            # the reply's leading object is a call (or an error saying why not), and so is each object of a
            # leading list of named objects; elsewhere an object is a call when it has a name and arguments
            if start == 0 and body[0] == "[":
                if not items or not all(isinstance(o, dict) and "name" in o for o in items):
                    continue  # a list in prose ("[1, 2] are the roots")
            elif start == 0 and not (isinstance(obj, dict) and "name" in obj):
                try:  # a leading object without a name: the reply's error, unless a call follows (then data)
                    _read_call(obj, self._ARGUMENTS)
                except ValueError as exc:
                    unnamed, leading_end = str(exc), end
                continue
            elif start != 0 and not self._is_call(obj, self._ARGUMENTS):
                continue  # JSON data in prose ({"temp": 21})
            prose.append(body[last:start])
            last = end
            try:
                calls.extend(_read_call(o, self._ARGUMENTS) for o in items)
            except ValueError as exc:
                return parsed(str(exc))
        if unnamed is not None and not calls:
            return ToolCallParse([], body[leading_end:].strip(" \t\n;"), unnamed, text)
        return parsed()

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)

    def system_prompt(self, tools: Sequence[ToolSchema]) -> str:
        return ("You have access to the functions below. To call one, answer with a JSON object "
                "{\"name\": function name, \"parameters\": dictionary of argument names and values} and nothing "
                "else.\n\n" + _tools_json(tools, indent=4))


@register_tool_call_format("hermes")
def _hermes() -> HermesFormat:
    return HermesFormat()


@register_tool_call_format("llama3_json")
def _llama3_json() -> Llama3JsonFormat:
    return Llama3JsonFormat()


# ------------------------------------------------------------------------------------------ reasoning blocks
KNOWN_REASONING_MARKERS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),  # DeepSeek-R1, Qwen3, QwQ, SmolLM3
    ("<thinking>", "</thinking>"),
    ("<reasoning>", "</reasoning>"),
    ("<seed:think>", "</seed:think>"),  # Seed-OSS
    ("\u25c1think\u25b7", "\u25c1/think\u25b7"),  # Kimi
    ("<|begin_of_thought|>", "<|end_of_thought|>"),
)
"""``(open, close)`` of the reasoning blocks models write; ``<think>`` always counts, the others when the
tokenizer's chat template or added vocabulary names them (:func:`reasoning_markers`)."""


def reasoning_markers(tokenizer: Any) -> tuple[tuple[str, str], ...]:
    """The reasoning blocks of ``tokenizer``'s model: ``<think>...</think>`` and every known pair
    (:data:`KNOWN_REASONING_MARKERS`) whose opening marker its chat template or added vocabulary holds."""
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    try:
        added = set(tokenizer.get_added_vocab())
    except Exception:  # noqa: BLE001 (a tokenizer without added vocabulary)
        added = set()
    return tuple(pair for i, pair in enumerate(KNOWN_REASONING_MARKERS)
                 if i == 0 or pair[0] in template or pair[0] in added)


def _reasoning_spans(text: str, markers: Sequence[tuple[str, str]], open_at_start: bool,
                     call: tuple[str, str] | None = None) -> tuple[list[tuple[int, int]], bool]:
    """``(spans of text inside reasoning blocks, markers included; whether a block is still open at the end)``.
    ``open_at_start``: the prompt already opened a block (a template whose generation prompt ends in ``<think>``).
    Blocks do not nest (as the models write them) and end at their own close marker (``</thinking>`` inside
    ``<think>`` is text); ``call``: the format's ``(open, close)`` call markup, whose blocks outside reasoning are
    data (a program that prints ``<think>`` opens nothing). One pass over the markers, linear in ``len(text)``."""
    if not markers:
        return [], open_at_start
    pattern = re.compile("|".join(re.escape(m) for pair in (*markers, *([call] if call else [])) for m in pair))
    close_of = {open_: close for open_, close in markers}
    spans: list[tuple[int, int]] = []
    start: int | None = 0 if open_at_start else None
    # the prompt opened a block: any close ends it (which marker the template wrote is not known here)
    want: str | set[str] | None = {close for _, close in markers} if open_at_start else None
    in_call = False
    for match in pattern.finditer(text):
        marker = match.group(0)
        if start is None and call is not None and marker in call:  # a call outside reasoning: its text is data
            in_call = marker == call[0]
        elif start is None and in_call:
            continue
        elif start is None and marker in close_of:
            start, want = match.start(), close_of[marker]
        elif start is not None and (marker == want or isinstance(want, set) and marker in want):
            spans.append((start, match.end()))  # a block ends at its own close only ("</thinking>" in <think>...)
            start = want = None
    if start is not None:
        spans.append((start, len(text)))
    return spans, start is not None


def strip_reasoning(text: str, markers: Sequence[tuple[str, str]], open_at_start: bool = False,
                    call: tuple[str, str] | None = None) -> str:
    """``text`` without its reasoning blocks (an unclosed last block: to the end): a call drafted while thinking is
    never played. ``"<think>draft <tool_call>..</tool_call></think> <tool_call>real</tool_call>"`` ->
    ``" <tool_call>real</tool_call>"`` (``call``: see :func:`_reasoning_spans`)."""
    spans, _ = _reasoning_spans(text, markers, open_at_start, call)
    if not spans:
        return text
    pieces, last = [], 0
    for start, end in spans:
        pieces.append(text[last:start])
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def reasoning_open(text: str, markers: Sequence[tuple[str, str]], open_at_start: bool = False,
                   call: tuple[str, str] | None = None) -> bool:
    """Whether a reasoning block is open at the end of ``text`` (a stop string that ends it fired while thinking)."""
    return _reasoning_spans(text, markers, open_at_start, call)[1]


def prompt_opens_reasoning(prompt_tail: str, markers: Sequence[tuple[str, str]]) -> bool:
    """Whether the generation prompt opened a reasoning block (DeepSeek-R1's and Qwen3-Thinking's end in
    ``<think>``): the prompt's text ends, spaces aside, with an opening marker. A marker earlier in the prompt is in
    the conversation, the env's text included (a problem, a tool's output, which are data), and opens nothing."""
    tail = prompt_tail.rstrip()
    return any(tail.endswith(open_) for open_, _ in markers)


def decode_for_parsing(tokenizer: Any, ids: Sequence[int], keep: Sequence[str]) -> str:
    """``ids`` decoded without special tokens, except the strings of ``keep`` (a format's :attr:`markup`, reasoning
    markers), written where their tokens are even when the tokenizer holds them as special tokens (Hermes-2-Pro's
    ``<tool_call>``: a plain ``decode(skip_special_tokens=True)`` drops them and the call is lost; vllm PR #25281,
    verl #4757). Linear in ``len(ids)``."""
    try:
        added = tokenizer.get_added_vocab()
    except Exception:  # noqa: BLE001 (a tokenizer without added vocabulary: nothing special to keep)
        added = {}
    kept = {added[s]: s for s in keep if s in added}
    if not kept:
        return tokenizer.decode(list(ids), skip_special_tokens=True)
    pieces: list[str] = []
    run: list[int] = []
    for token in ids:
        if token in kept:
            if run:
                pieces.append(tokenizer.decode(run, skip_special_tokens=True))
                run = []
            pieces.append(kept[token])
        else:
            run.append(token)
    if run:
        pieces.append(tokenizer.decode(run, skip_special_tokens=True))
    return "".join(pieces)


# ------------------------------------------------------------------------------------------ chat templates
_PROBE_TOOL: ToolSchema = {"type": "function", "function": {
    "name": "agentrlprobetool", "description": "agentrlprobedescription",
    "parameters": {"type": "object", "properties": {"agentrlprobearg": {"type": "string"}}}}}


def _render(tokenizer: Any, messages: list[dict[str, Any]], **kw: Any) -> str | None:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kw)
    except Exception:  # noqa: BLE001 (jinja's TemplateError, raise_exception, a missing key: the template cannot)
        return None


@dataclass(frozen=True)
class TemplateTools:
    """What a chat template can show. ``tools``: it renders ``tools=`` (the probe tool's name and description
    appear); ``tool_calls``: it renders an assistant message's ``tool_calls``; ``tool_role``: it renders a ``tool``
    message's content."""

    tools: bool
    tool_calls: bool
    tool_role: bool

    @staticmethod
    def of(tokenizer: Any) -> "TemplateTools":
        """Probe ``tokenizer``'s chat template (cached per template text)."""
        template = getattr(tokenizer, "chat_template", None)
        if not template or not isinstance(template, str):
            return TemplateTools(False, False, False)
        key = hashlib.sha256(template.encode("utf-8")).hexdigest()
        if key not in _PROBED:
            base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
            with_tools = _render(tokenizer, base, tools=[_PROBE_TOOL], add_generation_prompt=True) or ""
            call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "agentrlprobetool", "arguments": {"agentrlprobearg": "agentrlprobevalue"}}}]}
            calls = _render(tokenizer, base + [call], add_generation_prompt=False) or ""
            answered = _render(tokenizer, base + [{"role": "assistant", "content": "a"},
                                                  {"role": "tool", "content": "agentrlprobeanswer"}],
                               add_generation_prompt=True) or ""
            _PROBED[key] = TemplateTools(
                tools="agentrlprobetool" in with_tools and "agentrlprobedescription" in with_tools,
                tool_calls="agentrlprobetool" in calls and "agentrlprobevalue" in calls,
                tool_role="agentrlprobeanswer" in answered)
        return _PROBED[key]


_PROBED: dict[str, TemplateTools] = {}


def tool_messages(messages: list[dict[str, Any]], tools: Sequence[ToolSchema], tokenizer: Any,
                  fmt: ToolCallFormat) -> tuple[list[dict[str, Any]], list[ToolSchema] | None]:
    """``(messages, tools=)`` to render for ``tokenizer``'s template: unchanged (and ``tools``) when the template
    shows tools, tool calls and tool messages; otherwise the tools go into the system message (one is added first
    when there is none) as :meth:`ToolCallFormat.system_prompt` words them, past calls into their message's content
    as :meth:`ToolCallFormat.render_call` writes them, and ``tool`` messages become ``user`` messages."""
    caps = TemplateTools.of(tokenizer)
    out: list[dict[str, Any]] = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls") and not caps.tool_calls:
            calls = [fmt.render_call(c["function"]["name"], c["function"]["arguments"]) for c in m.pop("tool_calls")]
            m["content"] = "\n".join(p for p in [m.get("content", "")] + calls if p)
        if m.get("role") == "tool" and not caps.tool_role:
            m["role"] = "user"
        out.append(m)
    if not tools or caps.tools:
        return out, (list(tools) if tools else None)
    prompt = fmt.system_prompt(tools)
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}" if out[0]["content"] else prompt}
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out, None


def assistant_message(action: str, fmt: ToolCallFormat) -> dict[str, Any]:
    """The assistant message of a past turn whose env action was ``action`` (``envs.tools`` encoding): its call as
    ``tool_calls``; an unreadable call or a text reply as the text the model wrote."""
    try:
        obj = json.loads(action) if action.lstrip().startswith("{") else None
    except ValueError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get("arguments"), dict):
        return {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": obj["name"], "arguments": obj["arguments"]}}]}
    if isinstance(obj, dict) and "invalid_tool_call" in obj:
        return {"role": "assistant", "content": str(obj.get("text", ""))}
    return {"role": "assistant", "content": action}
