import json
import re

import pytest

from inference.engine.core.structured_output import (
    StructuredOutput,
    StructuredOutputError,
    check_json_schema,
)

PERSON = {
    "title": "Person",
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "description": "Full name"},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 3},
        "kind": {"anyOf": [{"const": "a"}, {"enum": ["b", "c"]}]},
        "born": {"type": "string", "format": "date"},
    },
    "required": ["name"],
    "additionalProperties": False,
    "$defs": {"tag": {"type": "string", "pattern": "^[a-z]+$"}},
}


def test_a_schema_of_enforced_keywords_and_annotations_is_accepted():
    check_json_schema(PERSON)
    check_json_schema(True)


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"allOf": [{"type": "integer"}]}, "#/allOf"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "#/oneOf"),
        ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}, "#/properties/a/not"),
        ({"type": "array", "uniqueItems": True}, "#/uniqueItems"),
        ({"if": {"type": "string"}, "then": {"minLength": 2}}, "#/if"),
        ({"$defs": {"x": {"type": "string", "format": "iri"}}}, "#/$defs/x/format"),
        ({"type": "object", "x-vendor": 1}, "#/x-vendor"),
        ({"type": "array", "contains": {"type": "integer"}}, "#/contains"),
        ({"$ref": "https://example.com/person.json"}, "#/$ref"),
        ({"type": []}, "#/type"),
        ({"type": ["string", "date"]}, "#/type"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "#/dependentRequired"),
    ],
)
def test_a_keyword_the_grammar_would_ignore_is_refused_with_its_path(schema, where):
    with pytest.raises(StructuredOutputError, match=f"^{re.escape(where)}: "):
        check_json_schema(schema)


def test_a_schema_that_is_not_a_schema_is_refused():
    with pytest.raises(StructuredOutputError, match="must be an object or a boolean"):
        check_json_schema([{"type": "string"}])
    with pytest.raises(StructuredOutputError, match="#/properties: must be an object"):
        check_json_schema({"properties": ["a"]})
    with pytest.raises(StructuredOutputError, match="#/anyOf: must be a non-empty array"):
        check_json_schema({"anyOf": []})


def test_equal_schemas_make_equal_structured_outputs_whatever_their_key_order():
    reordered = json.loads(json.dumps(PERSON, sort_keys=True))
    first = StructuredOutput.json_schema(PERSON, strict=True)
    assert first == StructuredOutput.json_schema(reordered, strict=True)
    assert hash(first) == hash(StructuredOutput.json_schema(reordered, strict=True))
    assert first != StructuredOutput.json_schema(PERSON, strict=False)


def test_a_kind_without_its_spec_is_refused():
    with pytest.raises(StructuredOutputError, match="needs its spec"):
        StructuredOutput("json_schema")
    with pytest.raises(StructuredOutputError, match="unknown structured output kind"):
        StructuredOutput("yaml", "x")  # type: ignore[arg-type]
