"""Request bodies of the OpenAI-compatible endpoints. Unknown fields are ignored, not fatal;
known ones are taken only in their own JSON type (no coercion: `"stream": "yes"` is a 400, not
true; `"max_tokens": "5"` is a 400, not 5)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_STOP_STRINGS = 4
MAX_BATCH_INPUTS = 256


class Lenient(BaseModel):
    # NOTE: OpenAI clients send fields we do not know (logit_bias, response_format, ...); they
    # are ignored rather than refused, as the issue asks. strict: a value of another JSON type
    # is refused, never guessed (pydantic's lax mode reads "yes", "on" and "1" as true).
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(Lenient):
    type: Literal["text"]
    text: str


class FunctionCall(Lenient):
    name: str
    arguments: str = Field(description="The arguments as JSON text (an object).")


class MessageToolCall(Lenient):
    id: Annotated[str, Field(min_length=1)]
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = Field(
        default=None, description="An assistant message's calls."
    )
    tool_call_id: str | None = Field(default=None, description="The call a tool message answers.")

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(Lenient):
    include_usage: bool = False


class RagOptions(Lenient):
    """Cachet's extension: answer from these collections (ids or names) and return the sources."""

    collections: list[int | str] | None = Field(
        default=None, description="Collection ids or names; omitted: all the key's user may read."
    )
    top_k: Annotated[int, Field(ge=1, le=20)] | None = None


class JsonSchemaFormat(Lenient):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    # NOTE: `schema` would shadow pydantic's BaseModel.schema.
    json_schema: dict | bool = Field(alias="schema")
    strict: bool | None = Field(
        default=None, description="true: objects are closed unless the schema opens them."
    )


class ResponseFormat(Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(Lenient):
    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=1)] | None = Field(default=None, description="Extension.")
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    n: int | None = 1
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(default=False, description="Extension (load testers, vLLM).")
    response_format: ResponseFormat | None = Field(
        default=None, description="Structured outputs: JSON, or JSON valid against a schema."
    )


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    rag: RagOptions | None = Field(default=None, description="Extension: retrieval over documents.")
    logprobs: bool | None = Field(default=None, description="Each token's log-probability.")
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = Field(
        default=None, description="And the most likely tokens' at each position (logprobs: true)."
    )
    tools: list[dict] | None = Field(
        default=None, description="Function tools (for models whose chat template defines them)."
    )
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(SamplingFields):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=MAX_BATCH_INPUTS)]
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = Field(
        default=None, description="Log-probabilities of each token and this many top tokens."
    )


class EmbeddingRequest(Lenient):
    model: str
    input: str | Annotated[list[str], Field(min_length=1, max_length=MAX_BATCH_INPUTS)]
    encoding_format: Literal["float", "base64"] | None = "float"
    user: str | None = None
    # NOTE: not OpenAI's; NVIDIA's and Cohere's name for it. Asymmetric models (e5) embed search
    # queries and indexed passages differently; unset, texts are embedded as passages.
    input_type: Literal["query", "passage"] | None = None


class SearchRequest(Lenient):
    query: Annotated[str, Field(min_length=1, max_length=2000)]
    collections: list[int | str] | None = None
    top_k: Annotated[int, Field(ge=1, le=50)] | None = None


CollectionName = Annotated[str, Field(min_length=1, max_length=200)]


class CollectionCreate(Lenient):
    name: CollectionName
    description: str = ""
    readers: list[str] | None = Field(default=None, description="Usernames who may read it.")
    reader_groups: list[str] | None = Field(
        default=None, description="Names of groups whose members may read it."
    )


class CollectionUpdate(Lenient):
    """Only the fields given change; `readers` / `reader_groups` replace the whole set."""

    name: CollectionName | None = None
    description: str | None = None
    readers: list[str] | None = None
    reader_groups: list[str] | None = None
