"""StructuredOutput: the shape a request's output must have, and which JSON Schemas can be kept.

A request with a `StructuredOutput` is decoded under a grammar (inference/engine/grammar.py):
each step only tokens that keep the output a prefix of a valid document can be sampled, so the
finished output parses and validates. That promise holds only for schema keywords the grammar
really enforces; xgrammar accepts some others and silently ignores them (measured with 0.2.9:
`allOf`, `oneOf`'s exclusivity, `not`, `if`/`then`/`else`, `uniqueItems`, `contains`,
`dependentRequired`, and the formats not in `ENFORCED_FORMATS`; tests/engine/test_grammar.py
holds a violating instance per accepted keyword, so an xgrammar upgrade that changes this fails
there). A schema using one of those is refused by `check_json_schema` with the path
of the keyword, rather than answered with output that may not validate.

Some enforced keywords are enforced more strictly than JSON Schema reads them, which costs
choice, never validity: `pattern` and `patternProperties` match the whole string (JSON Schema
searches: `"a"` matches "cat"), so an unanchored pattern allows fewer strings than it would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

StructuredOutputKind = Literal["json", "json_schema", "structural_tag"]

# Keywords whose constraint the grammar enforces, or which constrain nothing (annotations).
ENFORCED_KEYWORDS = frozenset(
    {
        "type", "enum", "const", "anyOf",
        "properties", "required", "additionalProperties", "patternProperties", "propertyNames",
        "minProperties", "maxProperties",
        "items", "prefixItems", "minItems", "maxItems",
        "minLength", "maxLength", "pattern", "format",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "$ref", "$defs", "definitions",
    }
)  # fmt: skip
ANNOTATION_KEYWORDS = frozenset(
    {
        "$schema", "$id", "$anchor", "$comment", "title", "description", "default", "examples",
        "deprecated", "readOnly", "writeOnly", "contentMediaType",
        # NOTE: `strict` is OpenAI's (it sits beside the schema in some clients' payloads).
        "strict",
    }
)  # fmt: skip
ENFORCED_FORMATS = frozenset(
    {
        "date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uri",
        "uri-reference", "uri-template", "uuid", "json-pointer", "relative-json-pointer",
    }
)  # fmt: skip
JSON_TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})
# Keywords holding one subschema, a name -> subschema map, or a list of subschemas.
_SUBSCHEMA = ("additionalProperties", "propertyNames", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "prefixItems")


class StructuredOutputError(ValueError):
    """A structured output that cannot be served: invalid, or not enforceable by the grammar.

    `param` names the request field it came from, for error responses.
    """

    def __init__(self, message: str, param: str = "response_format") -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """What a request's output must be.

    - `json`: any JSON object (OpenAI's `json_object` mode);
    - `json_schema`: JSON valid against `spec` (the schema as JSON text); `strict` makes
      objects closed unless the schema says otherwise (additionalProperties defaults to false),
      as OpenAI's strict mode does;
    - `structural_tag`: xgrammar's structural tag `spec` (JSON text): free text with tagged,
      schema-constrained sections, which tool calling uses.
    """

    kind: StructuredOutputKind
    spec: str = ""
    strict: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("json", "json_schema", "structural_tag"):
            raise StructuredOutputError(f"unknown structured output kind {self.kind!r}")
        if self.kind != "json" and not self.spec:
            raise StructuredOutputError(f"a {self.kind} structured output needs its spec")

    @classmethod
    def json_schema(
        cls, schema: dict[str, object] | bool, *, strict: bool = True
    ) -> StructuredOutput:
        """From a schema object, checked with `check_json_schema` and kept as canonical JSON
        (so equal schemas share one compiled grammar)."""
        check_json_schema(schema)
        return cls("json_schema", json.dumps(schema, sort_keys=True), strict)


def check_json_schema(schema: object, path: str = "#") -> None:
    """Raise StructuredOutputError unless every keyword of `schema` is enforced or inert."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise StructuredOutputError(
            f"{path}: a JSON Schema must be an object or a boolean, got {json.dumps(schema)}"
        )
    for keyword, value in schema.items():
        where = f"{path}/{keyword}"
        if keyword in ANNOTATION_KEYWORDS:
            continue
        if keyword not in ENFORCED_KEYWORDS:
            raise StructuredOutputError(
                f"{where}: the keyword {keyword!r} cannot be enforced during decoding; "
                f"supported keywords: {', '.join(sorted(ENFORCED_KEYWORDS))}"
            )
        if keyword == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            # NOTE: xgrammar would read another document's reference as "anything".
            raise StructuredOutputError(
                f"{where}: only references into this schema (#/...) can be followed, got {value!r}"
            )
        if keyword == "type":
            types = value if isinstance(value, list) else [value]
            if not types or any(name not in JSON_TYPES for name in types):
                raise StructuredOutputError(
                    f"{where}: must be one of {', '.join(sorted(JSON_TYPES))} or a non-empty "
                    f"list of them, got {json.dumps(value)}"
                )
        if keyword == "format" and value not in ENFORCED_FORMATS:
            raise StructuredOutputError(
                f"{where}: the format {value!r} cannot be enforced during decoding; "
                f"supported formats: {', '.join(sorted(ENFORCED_FORMATS))}"
            )
        for sub_path, subschema in _subschemas(keyword, value, where):
            check_json_schema(subschema, sub_path)


def _subschemas(keyword: str, value: object, where: str) -> Iterator[tuple[str, object]]:
    if keyword in _SUBSCHEMA:
        if isinstance(value, list):  # draft-07 tuple `items`
            yield from ((f"{where}/{i}", item) for i, item in enumerate(value))
        else:
            yield where, value
    elif keyword in _SUBSCHEMA_MAPS:
        if not isinstance(value, dict):
            raise StructuredOutputError(f"{where}: must be an object of schemas")
        yield from ((f"{where}/{name}", item) for name, item in value.items())
    elif keyword in _SUBSCHEMA_LISTS:
        if not isinstance(value, list) or not value:
            raise StructuredOutputError(f"{where}: must be a non-empty array of schemas")
        yield from ((f"{where}/{i}", item) for i, item in enumerate(value))
