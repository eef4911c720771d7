"""The models a chat may ask for by name (the chat's model picker, GET /chat/api/options/).

The same names the WebSocket's `model` field and `GET /v1/models` take: the in-process engine's
model and each enabled remote backend's; `auto` (the routing rules) is always allowed and is not
listed here. With one model there is nothing to pick, and the UI shows no picker.
"""

from __future__ import annotations

from backends.replicas import remote_models
from inference import runtime
from inference.models import ModelConfig


def local_model_name() -> str:
    """The in-process engine's model as clients name it (the configured one while it loads)."""
    return runtime.engine_status()["model"] or runtime.served_model_name(ModelConfig.active())


def chat_models() -> list[dict[str, object]]:
    """[{"name", "is_local"}]: the local model first, then the remote backends' models."""
    local = local_model_name()
    remote = [name for name in remote_models() if name != local]
    remote_choices = [{"name": name, "is_local": False} for name in remote]
    return [{"name": local, "is_local": True}, *remote_choices]
