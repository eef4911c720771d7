"""One chat turn of a saved conversation: begin it, answer it, save the answer.

`run_turn` saves the question (chat.store) before anything can fail, runs the answer loop
(chat.answer) and saves the answer with its sources and stats, also when it was stopped, cut
short or failed midway: nothing is lost. It yields the events of chat.events, for the WebSocket
consumer; problems a client can act on raise `ChatError` with a protocol error code
(docs/chat-protocol.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.utils.translation import gettext as _

from chat import store
from chat.answer import Answer, TurnControl, TurnInput, answer_turn
from chat.delta_sources import cache_salt_for
from chat.errors import ChatError
from chat.events import SourcesFound, TurnDone, TurnEvent, TurnStarted
from chat.models import AssistantProfile
from inference.engine import SamplingParams
from inference.models import ModelConfig


@dataclass(slots=True)
class TurnRequest:
    """What the client asked. `conversation_id=None` starts a new chat."""

    user: AbstractBaseUser
    content: str = ""
    conversation_id: int | None = None
    collection_ids: list[int] | None = None  # new chats only; None: the profile's defaults
    profile_id: int | None = None  # new chats only; None: the default profile
    seed: int | None = None  # None: a fresh random seed, saved with the answer
    regenerate: bool = False
    model: str | None = None  # an explicit model choice; None: the routing rules


async def run_turn(
    request: TurnRequest, control: TurnControl | None = None
) -> AsyncIterator[TurnEvent]:
    """Answer one message of a saved conversation (or regenerate its last answer), and save it."""
    control = control or TurnControl()
    begun = await store.begin_turn(request)
    yield TurnStarted(begun.conversation, None if request.regenerate else begun.question)

    question = begun.question
    turn = TurnInput(
        user=request.user,
        question=question.content,
        system_prompt=begun.profile.system_prompt,
        params=sampling_params_for(begun.profile, begun.model_config, seed=request.seed),
        history=begun.history,
        collection_ids=begun.collection_ids,
        search_top_k=begun.profile.search_top_k,
        prompt_content=question.prompt_content or None,
        sources=question.sources,
        request_id_prefix=f"chat-{begun.conversation.pk}",
        cache_salt=cache_salt_for(request.user),
        requested_model=request.model,
        profile_routing=begun.profile.routing,
    )
    answer = Answer()
    try:
        # NOTE: aclosing, so a caller that stops reading ends answer_turn (which aborts the
        # request and sets the finish reason) before the answer below is saved.
        async with contextlib.aclosing(answer_turn(turn, answer, control)) as events:
            async for event in events:
                if isinstance(event, SourcesFound) and not question.prompt_content:
                    question.prompt_content = answer.prompt_content
                    question.sources = event.sources
                    await store.save_question_context(question)
                yield event
    finally:
        # NOTE: runs on stop, disconnect, engine failure and cancellation alike; shielded so a
        # cancelled task still saves what the user already saw.
        if answer.is_started:
            message = await asyncio.shield(store.save_answer(begun, answer, seed=turn.params.seed))
    if answer.finish_reason == "error":
        raise ChatError("engine_error", _("the engine failed while answering; try again"))
    yield TurnDone(message, begun.conversation)


def sampling_params_for(
    profile: AssistantProfile, model_config: ModelConfig, *, seed: int | None = None
) -> SamplingParams:
    """The profile's sampling settings, falling back to the model configuration's defaults."""

    def pick(name: str):
        value = getattr(profile, name)
        return getattr(model_config, name) if value is None else value

    return SamplingParams(
        temperature=pick("temperature"),
        top_p=pick("top_p"),
        top_k=pick("top_k"),
        max_tokens=pick("max_tokens"),
        # NOTE: a seed per answer, saved with it, makes every answer reproducible.
        seed=secrets.randbelow(2**31) if seed is None else seed,
    )
