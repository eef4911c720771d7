"""Tooling shared by tests, benchmarks and reliability suites (not shipped in the wheel)."""

from harness.chat_client import ChatClient, ChatReply, TurnResult, chat_exchange
from harness.chat_socket import CLOSED, ChatSocket, open_chat
from harness.cli import CannotRunError, chat_model_dir, counts, cpu_name, rounded, run_cli
from harness.live_server import LiveServer, LiveServerError, default_models_dir, free_port
from harness.site import SITE_TIMEOUT_S, SiteError

__all__ = [
    "CLOSED",
    "SITE_TIMEOUT_S",
    "CannotRunError",
    "ChatClient",
    "ChatReply",
    "ChatSocket",
    "LiveServer",
    "LiveServerError",
    "SiteError",
    "TurnResult",
    "chat_exchange",
    "chat_model_dir",
    "counts",
    "cpu_name",
    "default_models_dir",
    "free_port",
    "open_chat",
    "rounded",
    "run_cli",
]
