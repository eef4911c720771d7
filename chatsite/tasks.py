"""Project-level Celery tasks."""

from __future__ import annotations

import os
import socket

from celery import shared_task


@shared_task(name="chatsite.ping", acks_late=True, time_limit=30)
def ping(payload: str) -> dict[str, str | int]:
    """Echo `payload` with where it ran: proves the broker, a worker and the result backend work."""
    return {"payload": payload, "hostname": socket.gethostname(), "pid": os.getpid()}
