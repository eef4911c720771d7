"""Cachet's Django project: settings, URLs, ASGI entry point and Celery app."""

from chatsite.celery import app as celery_app

__all__ = ["celery_app"]
