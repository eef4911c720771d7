"""`response_format` → the engine's StructuredOutput: JSON mode and JSON Schema outputs.

Everything that can refuse a format runs before the request is queued, so a bad schema is a 400
in OpenAI's shape (param `response_format`), never an answer that is not what was asked for.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async

from api.errors import ApiError
from api.schemas import ResponseFormat
from inference import runtime
from inference.engine import Engine, StructuredOutput, StructuredOutputError


def structured_output_of(response_format: ResponseFormat | None) -> StructuredOutput | None:
    """The output constraint a `response_format` asks for (None: free text)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return StructuredOutput("json")
    spec = response_format.json_schema
    if spec is None:
        raise ApiError(
            400,
            "response_format of type json_schema needs its json_schema "
            '({"name": ..., "schema": {...}, "strict": true}).',
            param="response_format.json_schema",
        )
    try:
        return StructuredOutput.json_schema(spec.json_schema, strict=bool(spec.strict))
    except StructuredOutputError as error:
        raise invalid_format(error) from None


def invalid_format(error: StructuredOutputError) -> ApiError:
    return ApiError(400, str(error), param=error.param, code="invalid_response_format")


async def compile_on_local_engine(output: StructuredOutput | None) -> None:
    """Compile the grammar on the local engine, off the event loop, refusing what xgrammar
    cannot compile (an unknown type, a dangling $ref, contradictory bounds).

    NOTE: while no engine is loaded the request is refused later anyway (model_loading); a
    remote backend checks its own formats.
    """
    if output is None:
        return
    try:
        engine, _ = runtime.get_engine_and_model()
    except runtime.EngineUnavailable:
        return
    await compile_grammar(engine, output)


async def compile_grammar(
    engine: Engine, output: StructuredOutput, param: str = "response_format"
) -> None:
    """Compile `output` on `engine` off the event loop; a 400 naming `param` if it cannot be."""
    try:
        await sync_to_async(engine.compile_structured_output, thread_sensitive=False)(output)
    except StructuredOutputError as error:
        if param == "response_format":
            raise invalid_format(error) from None
        raise ApiError(400, str(error), param=param) from None
