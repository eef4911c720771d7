"""Structured outputs over /v1: `response_format` through the official client, against a live
server on the suite's real model.

The model is tiny and knows nothing of the schema (the prompt does not carry it, as with vLLM):
what these tests show is the grammar, which keeps any model's output valid.
"""

from __future__ import annotations

import json

import jsonschema_rs
import openai
import pytest
from pydantic import BaseModel

from tests.api.key_clients import live_server_with_a_key, openai_client

pytestmark = pytest.mark.real_weights

MODEL = "smollm2-135m-instruct"
GREEDY = {"temperature": 0, "max_tokens": 120, "seed": 0}
# NOTE: examples in the history make even this model answer with a short object (in float32 and
# bf16 alike); asked plainly, it writes runaway numbers until max_tokens.
QUESTION = [
    {"role": "system", "content": "You answer with JSON only."},
    {"role": "user", "content": "Paris"},
    {"role": "assistant", "content": '{"name": "Paris", "population": 2100000}'},
    {"role": "user", "content": "Tokyo"},
    {"role": "assistant", "content": '{"name": "Tokyo", "population": 14000000}'},
    {"role": "user", "content": "Rome"},
]
FEW_SHOT = (
    'City: Paris\nJSON: {"name": "Paris", "population": 2100000}\n'
    'City: Tokyo\nJSON: {"name": "Tokyo", "population": 14000000}\n'
    "City: Rome\nJSON:"
)
CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "population": {"type": "integer", "minimum": 0},
    },
    "required": ["name", "population"],
    "additionalProperties": False,
}


class City(BaseModel):
    name: str
    population: int


def city_format(schema: dict = CITY, strict: bool = True) -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": schema, "strict": strict},
    }


@pytest.fixture(scope="module")
def server(chat_model_dir):
    with live_server_with_a_key(chat_model_dir.parent) as live:
        yield live


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai_client(server)


def test_the_official_clients_parse_helper_gets_a_valid_object(client) -> None:
    completion = client.chat.completions.parse(
        model=MODEL, messages=QUESTION, response_format=City, **GREEDY
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)
    assert choice.message.parsed == City.model_validate_json(choice.message.content)


def test_a_json_schema_answer_is_the_models_own_when_it_conforms_and_streams_the_same(
    client,
) -> None:
    free = client.chat.completions.create(model=MODEL, messages=QUESTION, **GREEDY)
    answer = client.chat.completions.create(
        model=MODEL, messages=QUESTION, response_format=city_format(), **GREEDY
    )
    text = answer.choices[0].message.content
    jsonschema_rs.validator_for(CITY).validate(json.loads(text))
    assert json.loads(text) == json.loads(free.choices[0].message.content)
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, response_format=city_format(), stream=True, **GREEDY
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_json_mode_answers_with_an_object(client) -> None:
    answer = client.chat.completions.create(
        model=MODEL, messages=QUESTION, response_format={"type": "json_object"}, **GREEDY
    )
    assert isinstance(json.loads(answer.choices[0].message.content), dict)


def test_completions_take_a_response_format_too_and_end_with_the_document(client) -> None:
    # NOTE: a first request puts the prompt's whole blocks in the prefix cache, so the two
    # compared below compute the same remaining tokens in the same step shape: a GEMM's rounding
    # can depend on how many rows it is given, and greedy decoding follows near ties.
    client.completions.create(model=MODEL, prompt=FEW_SHOT, **GREEDY)
    free = client.completions.create(model=MODEL, prompt=FEW_SHOT, **GREEDY)
    bound = client.completions.create(
        model=MODEL, prompt=FEW_SHOT, extra_body={"response_format": city_format()}, **GREEDY
    )
    text = bound.choices[0].text
    jsonschema_rs.validator_for(CITY).validate(json.loads(text))
    assert bound.choices[0].finish_reason == "stop"
    assert free.choices[0].text.startswith(text + "\n")  # the model went on; the grammar ended


def test_a_budget_too_small_for_the_document_ends_with_length(client) -> None:
    answer = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        response_format=city_format(),
        **(GREEDY | {"max_tokens": 4}),
    )
    assert answer.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("response_format", "message"),
    [
        (city_format({"type": "strin"}), "#/type: must be one of"),
        (city_format({"enum": []}), "enum array must not be empty"),
        (city_format({"$ref": "#/$defs/nowhere"}), "nowhere"),
        (city_format({"allOf": [CITY]}), "#/allOf: the keyword 'allOf' cannot be enforced"),
        (city_format({"type": "string", "format": "iri"}), "the format 'iri' cannot be enforced"),
        ({"type": "json_schema"}, "needs its json_schema"),
    ],
)
def test_a_schema_that_cannot_be_kept_is_a_400_naming_the_problem(
    client, response_format, message
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, response_format=response_format, **GREEDY
        )
    assert message in refused.value.body["message"]
    assert refused.value.body["param"].startswith("response_format")


def test_a_malformed_response_format_is_a_400(server) -> None:
    raw = openai_client(server)
    for response_format in (
        {"type": "xml"},
        {"type": "json_schema", "json_schema": {"schema": {}}},
    ):
        with pytest.raises(openai.BadRequestError):
            raw.chat.completions.create(
                model=MODEL, messages=QUESTION, response_format=response_format, **GREEDY
            )
