"""Conversations, their messages, and the assistant profiles that answer them.

A user's conversations are theirs alone: every lookup goes through `Conversation.objects.owned_by`.
Messages keep what the prompt builder needs to rebuild the exact same prompt on the next turn (the
user turn as the model saw it, the answer's token ids), so the prefix cache hits.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from backends.routing import ProfileRouting
from retrieval.models import Collection

# NOTE: worded for the bundled 135M model, which follows short instructions best: longer prompts
# (tried: "be concise", "say so if the passages lack the answer") made it answer "1" or drift.
# The language sentence names no language: naming one ("a question in Chinese gets a Simplified
# Chinese answer") made the 1.5B answer English questions over Chinese passages in Chinese (16 of
# 24 right, against 24 of 24 with this wording). It costs "[n]" citations in Chinese answers
# (README, "Answers in the question's language"). It is fixed text, so it stays in the cached
# system prefix (DESIGN.md, "Prompt layout"). Changing the text needs a data migration for the
# profiles still on the old one (chat/migrations/0003_default_prompt_answer_language.py).
DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Answer the user's question using the documents they provide. "
    "Cite a document by its number in brackets, like [1]. Answer in the language of the "
    "question, not of the documents."
)
DEFAULT_PROFILE_NAME = "Assistant"
TITLE_MAX_CHARS = 80


class AssistantProfile(models.Model):
    """A fixed system prompt with its default collections and sampling settings.

    The system prompt is the cached prefix of every chat with this profile: keep dynamic data
    (names, dates) out of it. Empty sampling fields fall back to the active model configuration.
    """

    name = models.CharField(_("name"), max_length=100, unique=True)
    system_prompt = models.TextField(_("system prompt"), default=DEFAULT_SYSTEM_PROMPT)
    collections = models.ManyToManyField(
        Collection,
        blank=True,
        related_name="+",
        verbose_name=_("collections"),
        help_text=_("Searched by new chats with this profile (only those the user may read)."),
    )
    temperature = models.FloatField(
        _("temperature"),
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(2.0)],
    )
    top_p = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.01), MaxValueValidator(1.0)]
    )
    top_k = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_tokens = models.PositiveIntegerField(
        _("max tokens"), null=True, blank=True, validators=[MinValueValidator(1)]
    )
    search_top_k = models.PositiveIntegerField(
        _("search top k"),
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(20)],
        help_text=_("Chunks put into the prompt; empty: the CACHET_SEARCH_TOP_K setting."),
    )
    routing = models.CharField(
        _("routing"),
        max_length=8,
        choices=ProfileRouting.choices,
        default=ProfileRouting.AUTO,
        help_text=_(
            "Which backend answers this profile's chats (README, routing rules); without a "
            "remote backend, always the in-process engine."
        ),
    )
    is_default = models.BooleanField(
        _("is default"), default=False, help_text=_("Used by new chats by default.")
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        ordering = ["-is_default", "name"]
        verbose_name = _("assistant profile")
        verbose_name_plural = _("assistant profiles")
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"],
                condition=models.Q(is_default=True),
                name="one_default_assistant_profile",
            )
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        if self.is_default:
            AssistantProfile.objects.filter(is_default=True).exclude(pk=self.pk).update(
                is_default=False
            )
        super().save(*args, **kwargs)

    @classmethod
    def default(cls) -> AssistantProfile:
        """The default profile, created with the built-in system prompt if there is none."""
        profile = cls.objects.filter(is_default=True).first() or cls.objects.first()
        if profile is None:
            profile, _ = cls.objects.get_or_create(
                name=DEFAULT_PROFILE_NAME, defaults={"is_default": True}
            )
        return profile


class ConversationQuerySet(models.QuerySet):
    def owned_by(self, user: AbstractBaseUser | AnonymousUser) -> ConversationQuerySet:
        if not user.is_authenticated or not user.is_active:
            return self.none()
        return self.filter(owner=user)


class Conversation(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, blank=True)
    profile = models.ForeignKey(
        AssistantProfile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    collections = models.ManyToManyField(Collection, blank=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ConversationQuerySet.as_manager()

    class Meta:
        ordering = ["-updated_at", "-id"]
        indexes = [models.Index(fields=["owner", "-updated_at"])]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField()
    # The user turn as the model saw it (retrieved passages + question); kept so later turns
    # rebuild the identical prompt prefix. Empty for answers.
    prompt_content = models.TextField(blank=True)
    # The answer's token ids (without eos) from `model`; reused in history when the model matches.
    token_ids = models.JSONField(null=True, blank=True)
    sources = models.JSONField(default=list, blank=True)
    seed = models.BigIntegerField(null=True, blank=True)
    ttft_s = models.FloatField(null=True, blank=True)
    tokens_per_s = models.FloatField(null=True, blank=True)
    total_s = models.FloatField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Prompt tokens whose keys/values came from reused passages (the engine's chunk-KV reuse).
    reused_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    finish_reason = models.CharField(max_length=16, blank=True)
    model = models.CharField(max_length=300, blank=True)
    # Who answered ("local": the in-process engine; else an InferenceBackend's name) and the
    # routing rule that chose it (backends.routing).
    backend = models.CharField(max_length=64, blank=True)
    route = models.CharField(max_length=32, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:60]}"

    @property
    def stats(self) -> dict | None:
        if self.role != self.Role.ASSISTANT:
            return None
        return {
            "ttft_s": self.ttft_s,
            "tokens_per_s": self.tokens_per_s,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            # the same split in DeepSeek's words, as the API's usage gives it
            "prompt_cache_hit_tokens": self.cached_tokens,
            "prompt_cache_miss_tokens": self._prompt_cache_miss_tokens,
            "reused_tokens": self.reused_tokens or 0,
            "completion_tokens": self.completion_tokens,
            "total_s": self.total_s,
            "model": self.model,
            "backend": self.backend,
            "route": self.route,
        }

    @property
    def _prompt_cache_miss_tokens(self) -> int | None:
        if self.prompt_tokens is None or self.cached_tokens is None:
            return None
        return self.prompt_tokens - self.cached_tokens - (self.reused_tokens or 0)

    def as_json(self) -> dict:
        """The protocol's Message (docs/chat-protocol.md)."""
        is_answer = self.role == self.Role.ASSISTANT
        return {
            "id": self.pk,
            "role": self.role,
            "content": self.content,
            "sources": self.sources if is_answer else [],
            "stats": self.stats,
            "finish_reason": (self.finish_reason or None) if is_answer else None,
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }


def question_of(answer: Message) -> Message | None:
    """The user message an answer answers: the one just before it in its conversation."""
    return (
        Message.objects.filter(
            conversation_id=answer.conversation_id, role=Message.Role.USER, pk__lt=answer.pk
        )
        .order_by("-pk")
        .first()
    )


def title_from(question: str) -> str:
    """A chat title from its first question: one line, cut at a word boundary."""
    line = " ".join(question.split())
    if len(line) <= TITLE_MAX_CHARS:
        return line or "New chat"
    cut = line[: TITLE_MAX_CHARS - 1].rsplit(" ", 1)[0]
    return f"{cut or line[: TITLE_MAX_CHARS - 1]}…"


class AnswerFeedback(models.Model):
    """A user's thumbs up or down on one answer, with an optional note.

    Only the conversation's owner rates its answers (chat.feedback_views), so there is at most
    one per answer in practice; the unique pair keeps it so if that ever widens. Staff read them
    in the admin and turn them into golden questions (evals).
    """

    class Rating(models.TextChoices):
        UP = "up", _("Thumbs up")
        DOWN = "down", _("Thumbs down")

    NOTE_MAX_CHARS = 1000

    message = models.ForeignKey(
        Message, on_delete=models.CASCADE, related_name="feedback", verbose_name=_("answer")
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="answer_feedback",
        verbose_name=_("user"),
    )
    rating = models.CharField(_("rating"), max_length=4, choices=Rating.choices)
    note = models.TextField(_("note"), max_length=NOTE_MAX_CHARS, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        verbose_name = _("answer feedback")
        verbose_name_plural = _("answer feedback")
        constraints = [
            models.UniqueConstraint(fields=["message", "user"], name="one_feedback_per_answer")
        ]

    def __str__(self) -> str:
        return f"{self.get_rating_display()}: {self.message.content[:60]}"

    def as_json(self) -> dict:
        return {
            "rating": self.rating,
            "note": self.note,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
        }
