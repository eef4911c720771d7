"""Grammar-constrained decoding: xgrammar enforces what we accept, and the engine serves it."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema_rs
import pytest

from inference.engine import SamplingParams, StructuredOutput, StructuredOutputError
from inference.engine.core.structured_output import ENFORCED_FORMATS, ENFORCED_KEYWORDS
from inference.engine.grammar import Grammars
from tests.engine.real_model import RealEngines, float32_runner

# (schema, an instance it rejects, an instance it accepts), at least one per enforced keyword.
KEYWORD_CASES = [
    ({"type": ["string", "null"]}, "1", "null"),
    ({"enum": [1, "a"]}, "2", '"a"'),
    ({"const": "x"}, '"y"', '"x"'),
    ({"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, '"s"', "true"),
    (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        "{}",
        '{"a": 1}',
    ),
    (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        '{"b": 1}',
        '{"a": 2}',
    ),
    (
        {
            "type": "object",
            "patternProperties": {"^a": {"type": "integer"}},
            "additionalProperties": False,
        },
        '{"a": "x"}',
        '{"a": 1}',
    ),
    (
        {"type": "object", "propertyNames": {"pattern": "^a"}, "additionalProperties": True},
        '{"b": 1}',
        '{"a": 1}',
    ),
    (
        {"type": "object", "minProperties": 1, "additionalProperties": {"type": "integer"}},
        "{}",
        '{"k": 1}',
    ),
    (
        {"type": "object", "maxProperties": 1, "additionalProperties": {"type": "integer"}},
        '{"a": 1, "b": 2}',
        '{"a": 1}',
    ),
    ({"type": "array", "items": {"type": "integer"}}, '["a"]', "[1, 2]"),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, "[1, 2]", "[1]"),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, "[1]", "[1, 2]"),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 1}, "[1, 2]", "[1]"),
    ({"type": "string", "minLength": 3}, '"ab"', '"abc"'),
    ({"type": "string", "maxLength": 2}, '"abc"', '"ab"'),
    ({"type": "string", "pattern": "^[a-z]+$"}, '"A1"', '"ok"'),
    ({"type": "number", "minimum": 0}, "-1", "0"),
    ({"type": "number", "maximum": 1}, "2", "1"),
    ({"type": "number", "exclusiveMinimum": 0}, "0", "1"),
    ({"type": "number", "exclusiveMaximum": 1}, "1", "0.5"),
    ({"type": "integer", "multipleOf": 3}, "4", "6"),
    ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}, '"s"', "3"),
    ({"definitions": {"n": {"type": "integer"}}, "$ref": "#/definitions/n"}, '"s"', "3"),
    *(
        ({"type": "string", "format": name}, '"%% not a value ##"', json.dumps(valid))
        for name, valid in {
            "date-time": "2026-12-05T16:45:44Z",
            "time": "16:45:44Z",
            "date": "2026-12-05",
            "duration": "P1D",
            "email": "a@example.com",
            "hostname": "example.com",
            "ipv4": "127.0.0.1",
            "ipv6": "::1",
            "uri": "https://example.com/a",
            "uri-reference": "/a/b",
            "uri-template": "/a/{b}",
            "uuid": "123e4567-e89b-12d3-a456-426614174000",
            "json-pointer": "/a/0",
            "relative-json-pointer": "0/a",
        }.items()
    ),
]


@pytest.fixture(scope="module")
def grammars(real_tokenizer):
    return Grammars(real_tokenizer, len(real_tokenizer), [real_tokenizer.eos_token_id])


def accepts(grammars: Grammars, schema: dict, text: str) -> bool:
    state = grammars.start(StructuredOutput.json_schema(schema))
    ids = grammars.tokenizer.encode(text, add_special_tokens=False)
    return all(state.accept(token_id) for token_id in ids) and state.is_completed


def test_every_keyword_and_format_we_accept_has_a_case():
    keywords = {keyword for schema, _, _ in KEYWORD_CASES for keyword in _keywords(schema)}
    formats = {schema["format"] for schema, _, _ in KEYWORD_CASES if "format" in schema}
    assert keywords >= ENFORCED_KEYWORDS
    assert formats == ENFORCED_FORMATS


@pytest.mark.parametrize(("schema", "invalid", "valid"), KEYWORD_CASES)
def test_the_grammar_enforces_each_keyword_we_accept(grammars, schema, invalid, valid):
    validator = jsonschema_rs.validator_for(schema, validate_formats=True)
    assert not validator.is_valid(json.loads(invalid)) and validator.is_valid(json.loads(valid))
    assert not accepts(grammars, schema, invalid)
    assert accepts(grammars, schema, valid)


def test_equal_schemas_are_compiled_once(real_tokenizer):
    grammars = Grammars(real_tokenizer, len(real_tokenizer), [real_tokenizer.eos_token_id])
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    grammars.compile(StructuredOutput.json_schema(schema))
    grammars.compile(StructuredOutput.json_schema(json.loads(json.dumps(schema))))
    assert grammars.num_compiled == 1
    grammars.compile(StructuredOutput.json_schema(schema, strict=False))
    assert grammars.num_compiled == 2


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"enum": []}, "enum array must not be empty"),
        ({"$ref": "#/$defs/missing"}, "missing"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum"),
    ],
)
def test_a_schema_xgrammar_cannot_compile_is_an_error_naming_the_reason(grammars, schema, reason):
    with pytest.raises(StructuredOutputError, match="JSON Schema cannot be used") as raised:
        grammars.compile(StructuredOutput.json_schema(schema))
    assert reason in str(raised.value) and ".cc:" not in str(raised.value)


def _keywords(schema: object):
    if isinstance(schema, dict):
        for keyword, value in schema.items():
            yield keyword
            if keyword in ("properties", "patternProperties", "$defs", "definitions"):
                for subschema in value.values():
                    yield from _keywords(subschema)
            elif isinstance(value, dict):
                yield from _keywords(value)
            elif isinstance(value, list) and keyword in ("anyOf", "prefixItems"):
                for subschema in value:
                    yield from _keywords(subschema)


# ---- the engine, on the real model in float32 ----

MAX_MODEL_LEN = 512
FEW_SHOT = (
    'Country: France\nJSON: {"capital": "Paris", "population_millions": 68}\n'
    'Country: Japan\nJSON: {"capital": "Tokyo", "population_millions": 125}\n'
    "Country: Italy\nJSON:"
)
COUNTRY = {
    "type": "object",
    "properties": {
        "capital": {"type": "string", "maxLength": 40},
        "population_millions": {"type": "integer"},
    },
    "required": ["capital", "population_millions"],
}
GREEDY = SamplingParams(temperature=0, max_tokens=40)


@pytest.fixture(scope="module")
def make_engine(chat_model_dir, real_tokenizer):
    runner = float32_runner(chat_model_dir, kv_cache_mb=48, max_model_len=MAX_MODEL_LEN)
    engines = RealEngines(runner, real_tokenizer, chat_model_dir, MAX_MODEL_LEN)
    yield engines.make
    engines.shutdown()


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine()


def constrained(params: SamplingParams, schema: dict = COUNTRY, **changes) -> SamplingParams:
    output = StructuredOutput.json_schema(schema)
    return replace(params, structured_output=output, **changes)


@pytest.mark.real_weights
def test_greedy_decoding_keeps_the_models_own_answer_when_it_already_conforms(engine):
    free, bound = engine.generate([FEW_SHOT, FEW_SHOT], [GREEDY, constrained(GREEDY)])
    document = json.loads(bound.text)
    assert free.text.startswith(bound.text) and free.text != bound.text
    assert document == json.loads(free.text.split("\n")[0])
    assert bound.finish_reason == "stop"


@pytest.mark.real_weights
def test_sampled_outputs_always_parse_and_validate(engine):
    validator = jsonschema_rs.validator_for(COUNTRY)
    params = [
        constrained(SamplingParams(temperature=1.0, seed=seed, max_tokens=120)) for seed in range(8)
    ]
    results = engine.generate(["Describe a country as JSON:"] * 8, params)
    for result in results:
        assert result.finish_reason == "stop", result.text
        validator.validate(json.loads(result.text))
    assert len({result.text for result in results}) > 1


@pytest.mark.real_weights
def test_json_mode_gives_an_object_where_the_model_would_write_prose(engine):
    json_mode = SamplingParams(
        temperature=0, max_tokens=40, structured_output=StructuredOutput("json")
    )
    prose, forced = engine.generate(["Write a poem about the sea."] * 2, [GREEDY, json_mode])
    assert not prose.text.lstrip().startswith("{")
    assert forced.text.lstrip().startswith("{")
    free, answer = engine.generate([FEW_SHOT] * 2, [GREEDY, json_mode])
    assert answer.finish_reason == "stop"
    assert json.loads(answer.text) == json.loads(free.text.split("\n")[0])


@pytest.mark.real_weights
def test_constrained_and_free_requests_share_a_batch_without_changing_each_other(engine):
    prompts = [FEW_SHOT, "Name a primary colour.", FEW_SHOT, "What do bees make?"]
    sampled = SamplingParams(temperature=0.8, seed=3, max_tokens=30)
    params = [constrained(GREEDY), sampled, constrained(sampled), GREEDY]
    alone = [engine.generate([p], q)[0] for p, q in zip(prompts, params, strict=True)]
    together = engine.generate(prompts, params)  # queued at once: one running batch
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]


@pytest.mark.real_weights
def test_a_budget_too_small_for_the_document_finishes_with_length(engine):
    result = engine.generate([FEW_SHOT], constrained(GREEDY, max_tokens=5))[0]
    assert result.finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.text)


@pytest.mark.real_weights
def test_the_document_ends_the_answer_even_with_ignore_eos(engine):
    result = engine.generate([FEW_SHOT], constrained(GREEDY, ignore_eos=True))[0]
    assert result.finish_reason == "stop"
    json.loads(result.text)


@pytest.mark.real_weights
def test_speculative_decoding_leaves_constrained_requests_unchanged(engine, make_engine):
    speculative = make_engine(num_speculative_tokens=4)
    params = [constrained(GREEDY), GREEDY]
    expected = engine.generate([FEW_SHOT, FEW_SHOT], params)
    got = speculative.generate([FEW_SHOT, FEW_SHOT], params)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
