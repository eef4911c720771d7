"""Which backend answers a chat turn: the in-process engine or a remote model (docs/scale-out.md).

The rules, first match wins:

1. **Explicit model**: the request names a model (the API's `model`, the chat's `model` option).
   The local model's name: the in-process engine; a remote backend's model: that model's pool,
   with no fallback (the client asked for it); `auto` (or nothing): the rules below; anything
   else is refused.
2. **No remote model** for complex requests is enabled: the in-process engine.
3. **Profile setting**: an assistant profile routed `local` or `remote` always goes there.
4. **Prompt length**: history + passages + question of at least CACHET_ROUTE_PROMPT_CHARS
   characters: the remote model.
5. **Retrieval size**: at least CACHET_ROUTE_PASSAGES retrieved passages: the remote model.
6. Otherwise the in-process engine: short, simple turns stay local.

A route chosen by rules 3-5 falls back to the in-process engine when no replica of the remote
model can take the request (recorded with the reason `fallback`).

`choose_route` applies the rules to a `RoutingPolicy`; `routing_policy` makes the current one
from the enabled backends and the settings.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from backends.models import InferenceBackend
from backends.replicas import enabled_backends

LOCAL_BACKEND = "local"  # the in-process engine, as messages and metrics name it
AUTO_MODEL = "auto"


class ProfileRouting(models.TextChoices):
    AUTO = "auto", _("by the rules (prompt length, retrieval size)")
    LOCAL = "local", _("always the in-process engine")
    REMOTE = "remote", _("always the remote model for complex requests")


class UnknownModelError(ValueError):
    """The request names a model no backend serves."""

    def __init__(self, requested: str, served: Iterable[str]):
        names = ", ".join(sorted(served))
        super().__init__(f"the model `{requested}` does not exist; served here: {names}")
        self.requested = requested


@dataclass(frozen=True, slots=True)
class TurnShape:
    """What the rules look at."""

    requested_model: str | None = None
    profile_routing: str = ProfileRouting.AUTO
    prompt_chars: int = 0
    num_passages: int = 0


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    """The models on offer and the thresholds (from the settings and the enabled backends)."""

    local_model: str
    remote_models: Sequence[str] = ()
    complex_model: str | None = None  # the remote model complex turns go to
    long_prompt_chars: int = 6000
    many_passages: int = 8


@dataclass(frozen=True, slots=True)
class Route:
    model: str  # the model that answers, as it is named to clients
    is_remote: bool
    reason: str  # explicit, no_remote, profile, long_prompt, many_passages, short
    may_fall_back: bool = False  # a remote route the local engine may take over


def choose_route(shape: TurnShape, policy: RoutingPolicy) -> Route:
    """The route of one turn by the rules of the module doc."""
    requested = shape.requested_model
    if requested and requested != AUTO_MODEL:
        if requested == policy.local_model:
            return Route(policy.local_model, False, "explicit")
        if requested in policy.remote_models:
            return Route(requested, True, "explicit")
        raise UnknownModelError(requested, [policy.local_model, *policy.remote_models])
    if policy.complex_model is None:
        return Route(policy.local_model, False, "no_remote")
    if shape.profile_routing == ProfileRouting.LOCAL:
        return Route(policy.local_model, False, "profile")
    if shape.profile_routing == ProfileRouting.REMOTE:
        return Route(policy.complex_model, True, "profile", may_fall_back=True)
    if shape.prompt_chars >= policy.long_prompt_chars:
        return Route(policy.complex_model, True, "long_prompt", may_fall_back=True)
    if shape.num_passages >= policy.many_passages:
        return Route(policy.complex_model, True, "many_passages", may_fall_back=True)
    return Route(policy.local_model, False, "short")


def complex_model_of(backends: Iterable[InferenceBackend]) -> str | None:
    """The model that takes complex requests: of the enabled backends marked for them, the model
    with the largest total weight (ties: the first by name)."""
    weights: dict[str, int] = defaultdict(int)
    for backend in backends:
        if backend.is_enabled and backend.takes_complex_requests:
            weights[backend.model] += backend.weight
    if not weights:
        return None
    return min(weights, key=lambda model: (-weights[model], model))


def routing_policy(local_model: str) -> RoutingPolicy:
    """The policy now: the enabled backends' models (no query while none is enabled) and the
    settings' thresholds; `local_model` is the in-process engine's model name."""
    backends = enabled_backends()
    return RoutingPolicy(
        local_model=local_model,
        remote_models=sorted({backend.model for backend in backends}),
        complex_model=complex_model_of(backends),
        long_prompt_chars=settings.CACHET_ROUTE_PROMPT_CHARS,
        many_passages=settings.CACHET_ROUTE_PASSAGES,
    )
