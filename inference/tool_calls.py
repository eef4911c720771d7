"""Tool calls in the Hermes format that Qwen2.5's chat template defines, both ways.

The template tells the model to answer a call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(several such blocks for parallel calls), and renders earlier calls in the history the same way.
`tool_call_output` makes that a grammar (xgrammar's structural tag for the format): free text
as long as the model writes text, and once it opens `<tool_call>`, a call to one of the given
tools whose arguments validate against the tool's parameters. So every call parses, for
`tool_choice` "auto" as much as for "required" or a named function (which also force a call).
`ToolCallParser` splits the streamed text back into content and calls.

Templates that define another format (Llama 3.1's JSON, Mistral's [TOOL_CALLS]) or none are
refused by `supports_tool_calls` rather than served with a format the model was not taught.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import xgrammar as xgr

from inference.engine import StructuredOutput
from inference.engine.core.structured_output import check_json_schema

TOOL_CALL_BEGIN = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
# xgrammar's structural tag for this format (its "qwen_3" template without the reasoning block
# is Qwen2.5's Hermes format).
STRUCTURAL_TAG_MODEL = "qwen_3"
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
NO_PARAMETERS = {"type": "object", "properties": {}}


class ToolCallError(ValueError):
    """Tools or a tool choice that cannot be served; `param` names the request field."""

    def __init__(self, message: str, param: str = "tools") -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's API carries them


def supports_tool_calls(chat_template: str | None) -> bool:
    """Whether a chat template defines the format this module reads and writes."""
    return bool(chat_template) and TOOL_CALL_BEGIN in chat_template


def normalized_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function tools, checked: unique names, parameters an enforceable JSON Schema
    (absent parameters: a function without arguments)."""
    normalized, names = [], set()
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, dict):
            raise ToolCallError(f'{where}: only {{"type": "function", "function": {{...}}}} tools')
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise ToolCallError(f"{where}: function.name must match {TOOL_NAME.pattern}")
        if name in names:
            raise ToolCallError(f"{where}: a second tool named {name!r}")
        names.add(name)
        parameters = function.get("parameters", NO_PARAMETERS)
        try:
            check_json_schema(parameters, f"{where}.function.parameters#")
        except ValueError as error:
            raise ToolCallError(str(error)) from None
        normalized.append({"type": "function", "function": {**function, "parameters": parameters}})
    return normalized


def named_tool_choice(tool_choice: object, tools: list[dict[str, Any]]) -> str | None:
    """The function a tool_choice names (None for "auto", "none", "required"); checked."""
    if tool_choice in (None, "auto", "none", "required"):
        if tool_choice == "required" and not tools:
            raise ToolCallError('tool_choice "required" needs tools', "tool_choice")
        return None
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or not name:
        raise ToolCallError(
            'tool_choice must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if name not in {tool["function"]["name"] for tool in tools}:
        raise ToolCallError(
            f"tool_choice names {name!r}, which is not among the tools", "tool_choice"
        )
    return str(name)


def tool_call_output(
    tools: list[dict[str, Any]], tool_choice: object, *, parallel: bool = True
) -> StructuredOutput:
    """The grammar of an answer that may (auto) or must (required, named) call the tools."""
    choice = tool_choice if tool_choice is not None else "auto"
    tag = xgr.get_model_structural_tag(
        STRUCTURAL_TAG_MODEL,
        tools=tools,
        tool_choice=choice,
        reasoning="disabled",
        parallel_tool_calls=parallel,
    )
    return StructuredOutput("structural_tag", tag.model_dump_json())


class ToolCallParser:
    """Streamed text in, content and `ToolCall`s out, in order.

    Text that may be the start of `<tool_call>` is held back until it is or is not; whitespace
    right before a call is dropped (the model separates its text from the call with it). A call
    cut off by the end of the output (max_tokens) comes out as text, so nothing is lost.
    """

    def __init__(self) -> None:
        self._pending = ""
        self._in_call = False

    def feed(self, text: str) -> list[str | ToolCall]:
        self._pending += text
        events: list[str | ToolCall] = []
        while True:
            if self._in_call:
                body, found, rest = self._pending.partition(TOOL_CALL_END)
                if not found:
                    return events
                events.append(_parse_call(body))
                self._pending, self._in_call = rest.lstrip("\n"), False
                continue
            before, found, rest = self._pending.partition(TOOL_CALL_BEGIN)
            if found:
                if before.strip():
                    events.append(before.rstrip())
                self._pending, self._in_call = rest, True
                continue
            held = _held_back(self._pending)
            ready = self._pending[: len(self._pending) - held]
            if ready:
                events.append(ready)
            self._pending = self._pending[len(ready) :]
            return events

    def finish(self) -> list[str | ToolCall]:
        """What is still held back, at the end of the output."""
        pending, self._pending = self._pending, ""
        if self._in_call:
            self._in_call = False
            return [TOOL_CALL_BEGIN + pending]
        return [pending] if pending else []


def _held_back(text: str) -> int:
    """How many trailing characters to hold: trailing whitespace, and a partial begin tag."""
    for size in range(min(len(TOOL_CALL_BEGIN) - 1, len(text)), 0, -1):
        if TOOL_CALL_BEGIN.startswith(text[-size:]):
            return size + len(text[:-size]) - len(text[:-size].rstrip())
    return len(text) - len(text.rstrip())


def _parse_call(body: str) -> ToolCall | str:
    try:
        call = json.loads(body)
        name, arguments = call["name"], call.get("arguments", {})
    except (ValueError, KeyError, TypeError):
        # NOTE: only without a grammar (which keeps every call valid); shown as the text it is.
        return f"{TOOL_CALL_BEGIN}{body}{TOOL_CALL_END}"
    if not isinstance(name, str):
        return f"{TOOL_CALL_BEGIN}{body}{TOOL_CALL_END}"
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))
