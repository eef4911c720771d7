"""inference.tool_calls: the Hermes tool-call format, parsed from streamed text and kept by the
grammar (on Qwen2.5's real tokenizer)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from inference.engine.grammar import Grammars
from inference.tool_calls import (
    ToolCall,
    ToolCallError,
    ToolCallParser,
    named_tool_choice,
    normalized_tools,
    supports_tool_calls,
    tool_call_output,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}
ANSWER = (
    "Let me check.\n\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)
EXPECTED = [
    "Let me check.",
    ToolCall("get_weather", '{"city": "Paris", "days": 2}'),
    ToolCall("get_time", "{}"),
]


def parse(pieces: list[str]) -> list[str | ToolCall]:
    parser = ToolCallParser()
    events = [event for piece in pieces for event in parser.feed(piece)] + parser.finish()
    merged: list[str | ToolCall] = []
    for event in events:  # text may come in several pieces
        if isinstance(event, str) and merged and isinstance(merged[-1], str):
            merged[-1] += event
        else:
            merged.append(event)
    return merged


def test_calls_are_parsed_from_the_whole_text_and_from_every_split_of_it():
    assert parse([ANSWER]) == EXPECTED
    for cut in range(1, len(ANSWER)):
        assert parse([ANSWER[:cut], ANSWER[cut:]]) == EXPECTED, cut
    assert parse(list(ANSWER)) == EXPECTED


def test_text_that_only_looks_like_a_tag_start_is_released():
    parser = ToolCallParser()
    assert parser.feed("a < b and <tool") == ["a < b and"]
    assert parser.feed("box> is not one") == [" <toolbox> is not one"]
    assert parser.finish() == []


def test_a_call_cut_off_by_the_end_of_the_output_is_kept_as_text():
    assert parse(['<tool_call>\n{"name": "get_weather", "argu']) == [
        '<tool_call>\n{"name": "get_weather", "argu'
    ]


def test_a_call_that_is_not_json_is_kept_as_text():
    text = "<tool_call>\nnot json\n</tool_call>"
    assert parse([text]) == [text]


def test_tools_are_checked_and_given_empty_parameters_when_they_have_none():
    tools = normalized_tools([WEATHER, CLOCK])
    assert tools[1]["function"]["parameters"] == {"type": "object", "properties": {}}
    bad = [
        ([{"type": "retrieval"}], "only"),
        ([{"type": "function", "function": {"name": "two words"}}], "must match"),
        ([WEATHER, WEATHER], "a second tool named 'get_weather'"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"oneOf": [{}]}}}],
            "tools[0].function.parameters#/oneOf",
        ),
    ]
    for tools_in, message in bad:
        with pytest.raises(ToolCallError, match=message.replace("[", r"\[").replace("]", r"\]")):
            normalized_tools(tools_in)


def test_a_tool_choice_must_name_a_given_tool():
    tools = normalized_tools([WEATHER])
    assert named_tool_choice({"type": "function", "function": {"name": "get_weather"}}, tools)
    assert named_tool_choice("auto", tools) is None
    with pytest.raises(ToolCallError, match="not among the tools"):
        named_tool_choice({"type": "function", "function": {"name": "nope"}}, tools)
    with pytest.raises(ToolCallError, match="needs tools"):
        named_tool_choice("required", [])
    with pytest.raises(ToolCallError, match="must be"):
        named_tool_choice("sometimes", tools)


@pytest.fixture(scope="module")
def qwen_grammars(prepared_catalogue_model):
    directory = prepared_catalogue_model("qwen2.5-coder-0.5b-instruct")
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    assert supports_tool_calls(tokenizer.chat_template)
    return Grammars(tokenizer, len(tokenizer), [tokenizer.convert_tokens_to_ids("<|im_end|>")])


def accepts(grammars: Grammars, output, text: str) -> bool:
    state = grammars.start(output)
    ids = grammars.tokenizer.encode(text, add_special_tokens=False)
    return all(state.accept(token_id) for token_id in ids) and state.is_completed


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_the_grammar_keeps_calls_to_the_tools_with_valid_arguments(qwen_grammars):
    tools = normalized_tools([WEATHER, CLOCK])
    auto, required = tool_call_output(tools, "auto"), tool_call_output(tools, "required")
    named = tool_call_output(tools, {"type": "function", "function": {"name": "get_time"}})
    good = call("get_weather", {"city": "Paris"})
    assert accepts(qwen_grammars, auto, "Plain text, no call.")
    assert accepts(qwen_grammars, auto, "Checking. " + good)
    assert not accepts(qwen_grammars, auto, call("get_weather", {"town": "Paris"}))
    assert not accepts(qwen_grammars, auto, call("launch", {}))
    assert accepts(qwen_grammars, required, good)
    assert not accepts(qwen_grammars, required, "Plain text, no call.")
    assert accepts(qwen_grammars, named, call("get_time", {}))
    assert not accepts(qwen_grammars, named, good)


def test_templates_without_the_format_are_not_taken_for_ones_with_it(real_tokenizer_template):
    assert not supports_tool_calls(real_tokenizer_template)
    assert not supports_tool_calls(None)


@pytest.fixture
def real_tokenizer_template(chat_model_dir):
    return AutoTokenizer.from_pretrained(str(chat_model_dir)).chat_template
