"""The Celery application; tasks live in each app's `tasks.py`."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

# NOTE: chatsite is not an installed app, so autodiscovery would not find its tasks module.
app = Celery("cachet", include=["chatsite.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
