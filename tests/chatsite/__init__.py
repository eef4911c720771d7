"""Tests of chatsite/: settings from the environment, /healthz, the Celery app."""
