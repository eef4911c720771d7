"""Tool calling over /v1: the official `openai` client's tool-call loop end to end, against a live
server on Qwen2.5-Coder-0.5B (whose chat template defines tool calls), and the bad input a client
can send, each a 400 in OpenAI's shape before anything is queued."""

from __future__ import annotations

import json

import openai
import pytest

from tests.api.key_clients import live_server_with_a_key, openai_client

pytestmark = pytest.mark.real_weights

MODEL = "qwen2.5-coder-0.5b-instruct"
GREEDY = {"temperature": 0, "max_tokens": 80, "seed": 0}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "description": "The current time in a time zone."},
}
QUESTION = {"role": "user", "content": "What is the weather like in Paris today?"}
SYSTEM = {
    "role": "system",
    "content": "You are a helpful assistant. Answer the user's question from the tool results, "
    "in one sentence.",
}


@pytest.fixture(scope="module")
def server(prepared_catalogue_model):
    from django.conf import settings

    directory = prepared_catalogue_model(MODEL)
    env = {"CACHET_MODEL": MODEL, "CACHET_MODEL_CACHE": str(settings.CACHET_MODEL_CACHE)}
    with live_server_with_a_key(directory.parent, env) as live:
        yield live


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai_client(server)


def get_weather(city: str) -> dict:
    return {"city": city, "temperature_c": 21, "sky": "sunny"}


def test_the_official_clients_tool_call_loop_runs_end_to_end(client) -> None:
    messages: list = [SYSTEM, QUESTION]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required", **GREEDY
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert arguments["city"] == "Paris"

    messages.append(choice.message)  # the client's own object, as its docs show
    messages.append(
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(get_weather(**arguments))}
    )
    # NOTE: without the tools this time: shown them again, this 0.5B model calls again instead of
    # answering (the template renders the history's call and result either way).
    second = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    answer = second.choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls
    assert "21" in answer.message.content or "sunny" in answer.message.content.lower()


def test_a_streamed_call_arrives_as_deltas_that_add_up_to_the_same_call(client) -> None:
    whole = client.chat.completions.create(
        model=MODEL, messages=[QUESTION], tools=[WEATHER], tool_choice="required", **GREEDY
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[QUESTION],
        tools=[WEATHER],
        tool_choice="required",
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [d.index for d in deltas] == [0]
    [expected] = whole.choices[0].message.tool_calls
    assert deltas[0].function.name == expected.function.name
    assert json.loads(deltas[0].function.arguments) == json.loads(expected.function.arguments)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_named_tool_choice_calls_that_tool(client) -> None:
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[QUESTION],
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        **GREEDY,
    )
    [call] = answer.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    assert json.loads(call.function.arguments) == {}


def test_auto_may_answer_in_text_and_every_call_it_makes_is_valid(client) -> None:
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        tools=[WEATHER],
        tool_choice="auto",
        **GREEDY,
    )
    message = answer.choices[0].message
    for call in message.tool_calls or []:
        assert call.function.name == "get_weather"
        assert isinstance(json.loads(call.function.arguments)["city"], str)
    assert message.content or message.tool_calls


CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ],
}


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        (
            {"messages": [QUESTION, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
            "messages",
            "answers none",
        ),
        (
            {"messages": [QUESTION, {**CALL, "tool_calls": [{**CALL["tool_calls"][0],
             "function": {"name": "get_weather", "arguments": "Paris"}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "x"}]},
            "messages",
            "must be a JSON object",
        ),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools",
         "must match"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"allOf": []}}}]},
         "tools", "parameters#/allOf"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice", "not among the tools"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format",
         "cannot be combined"),
        ({"tools": [WEATHER], "rag": {}}, "rag", "cannot be combined"),
        ({"tools": [WEATHER], "messages": [QUESTION, CALL]}, "messages", "last message"),
    ],
)  # fmt: skip
def test_bad_tool_input_is_a_400_naming_the_field(server, fields, param, message) -> None:
    client = openai_client(server)
    body = {"messages": [QUESTION], **fields}
    extra = {"rag": body.pop("rag")} if "rag" in body else None
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, **GREEDY, **body, extra_body=extra)
    assert refused.value.body["param"] == param
    assert message in refused.value.body["message"]
