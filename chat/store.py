"""The chat turn's database side: small sync functions, wrapped for async callers.

`begin_turn` validates the request against what the user owns and may read, and saves the
question before anything can fail; `save_answer` stores the answer with its sources and stats.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils.translation import gettext as _

from backends.routing import LOCAL_BACKEND
from chat.answer import Answer
from chat.errors import ChatError
from chat.models import AssistantProfile, Conversation, Message, title_from
from inference.models import ModelConfig
from retrieval.models import Collection


@dataclass(slots=True)
class BegunTurn:
    conversation: Conversation
    question: Message  # the user message being answered (saved)
    history: list[Message]  # answered user/assistant pairs before it, oldest first
    profile: AssistantProfile
    collection_ids: list[int]  # searched, readable by the user now
    model_config: ModelConfig  # sampling defaults (unsaved defaults when none is active)
    replaced_answer_id: int | None = None  # regenerate: the answer the new one replaces


def check_content(content: object) -> str:
    if not isinstance(content, str):
        raise ChatError("invalid", "content must be a string")
    if not content.strip():
        raise ChatError("invalid", _("content must not be empty"))
    limit = settings.CACHET_MAX_MESSAGE_CHARS
    if len(content) > limit:
        raise ChatError(
            "too_long",
            _("the message has %(length)s characters; the limit is %(limit)s")
            % {"length": len(content), "limit": limit},
        )
    return content


@database_sync_to_async
def begin_turn(request) -> BegunTurn:
    user = request.user
    model_config = ModelConfig.active() or ModelConfig(name="defaults")
    if request.regenerate:
        conversation = _owned_conversation(user, request.conversation_id)
        return _begin_regenerate(conversation, model_config)
    content = check_content(request.content)
    with transaction.atomic():
        if request.conversation_id is None:
            conversation = _new_conversation(user, request.profile_id, request.collection_ids)
        else:
            conversation = _owned_conversation(user, request.conversation_id)
        history = answered_history(list(conversation.messages.all()))
        question = Message.objects.create(
            conversation=conversation, role=Message.Role.USER, content=content
        )
        conversation.save(update_fields=["updated_at"])
    return BegunTurn(
        conversation=conversation,
        question=question,
        history=history,
        profile=_profile_of(conversation),
        collection_ids=_readable_collection_ids(user, conversation),
        model_config=model_config,
    )


def _begin_regenerate(conversation: Conversation, model_config: ModelConfig) -> BegunTurn:
    messages = list(conversation.messages.all())
    last_question_index = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].role == Message.Role.USER),
        None,
    )
    if last_question_index is None:
        raise ChatError("nothing_to_regenerate", _("this conversation has no answer to regenerate"))
    question = messages[last_question_index]
    later = messages[last_question_index + 1 :]
    return BegunTurn(
        conversation=conversation,
        question=question,
        history=answered_history(messages[:last_question_index]),
        profile=_profile_of(conversation),
        collection_ids=_readable_collection_ids(conversation.owner, conversation),
        model_config=model_config,
        replaced_answer_id=later[0].pk if later else None,
    )


def answered_history(messages: list[Message]) -> list[Message]:
    """User/assistant pairs only: a question whose answer failed is kept but not replayed."""
    pairs: list[Message] = []
    for previous, message in itertools.pairwise(messages):
        if previous.role == Message.Role.USER and message.role == Message.Role.ASSISTANT:
            pairs.extend((previous, message))
    return pairs


def _owned_conversation(user, conversation_id: object) -> Conversation:
    if isinstance(conversation_id, bool) or not isinstance(conversation_id, int):
        raise ChatError("invalid", "conversation must be an integer id")
    conversation = (
        Conversation.objects.owned_by(user).select_related("profile").filter(pk=conversation_id)
    ).first()
    if conversation is None:
        # NOTE: the same answer for "missing" and "someone else's", so ids leak nothing.
        raise ChatError("not_found", _("conversation %(id)s not found") % {"id": conversation_id})
    return conversation


def _new_conversation(user, profile_id: int | None, collection_ids: list[int] | None):
    if profile_id is None:
        profile = AssistantProfile.default()
    else:
        profile = AssistantProfile.objects.filter(pk=profile_id).first()
        if profile is None:
            message = _("assistant profile %(id)s not found") % {"id": profile_id}
            raise ChatError("not_found", message)
    readable = Collection.readable_by(user)
    if collection_ids is None:
        defaults = profile.collections.all()
        # NOTE: a profile without default collections searches everything the user may read.
        chosen = readable.filter(pk__in=defaults) if defaults.exists() else readable
    else:
        chosen = readable.filter(pk__in=collection_ids)
        missing = set(collection_ids) - set(chosen.values_list("pk", flat=True))
        if missing:
            message = _("collections not found: %(ids)s") % {"ids": sorted(missing)}
            raise ChatError("not_found", message)
    conversation = Conversation.objects.create(owner=user, profile=profile)
    conversation.collections.set(chosen)
    return conversation


def _profile_of(conversation: Conversation) -> AssistantProfile:
    return conversation.profile or AssistantProfile.default()


def _readable_collection_ids(user, conversation: Conversation) -> list[int]:
    # NOTE: checked again every turn: a reader removed from a collection stops seeing it.
    readable = Collection.readable_by(user).filter(pk__in=conversation.collections.all())
    return sorted(readable.values_list("pk", flat=True))


@database_sync_to_async
def save_question_context(question: Message) -> None:
    Message.objects.filter(pk=question.pk).update(
        prompt_content=question.prompt_content, sources=question.sources
    )


@database_sync_to_async
def save_answer(begun: BegunTurn, answer: Answer, *, seed: int | None) -> Message:
    """Save `answer` as the reply to the turn's question."""
    conversation = begun.conversation
    usage = answer.usage
    message = Message(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        content=answer.text,
        # NOTE: only the in-process engine's token ids can be replayed into its prompts.
        token_ids=answer.token_ids if answer.backend == LOCAL_BACKEND else None,
        sources=answer.sources,
        seed=seed,
        finish_reason=answer.finish_reason or "",
        model=answer.model_name,
        backend=answer.backend,
        route=answer.route,
        prompt_tokens=usage.prompt_tokens if usage else answer.num_prompt_tokens,
        cached_tokens=usage.cached_tokens if usage else None,
        reused_tokens=usage.reused_tokens if usage else None,
        completion_tokens=usage.completion_tokens if usage else len(answer.token_ids),
        ttft_s=usage.ttft_s if usage else None,
        tokens_per_s=usage.tokens_per_s if usage else None,
        total_s=usage.total_s if usage else None,
    )
    with transaction.atomic():
        if not Conversation.objects.filter(pk=conversation.pk).exists():
            return message  # deleted meanwhile (another tab): nothing to keep it in
        message.save()
        if begun.replaced_answer_id is not None:
            Message.objects.filter(pk=begun.replaced_answer_id, conversation=conversation).delete()
        fields = ["updated_at"]
        if not conversation.title:
            conversation.title = title_from(begun.question.content)
            fields.append("title")
        conversation.save(update_fields=fields)
    return message
