"""Settings for the test suite: the production settings with test-only defaults for secrets."""

import os

# NOTE: setdefault, so CI can still run the suite against PostgreSQL and Redis through the
# environment, exactly as production reads it.
os.environ.setdefault("CACHET_SECRET_KEY", "cachet-test-suite-only-secret-key-not-for-production")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from chatsite.settings import *  # noqa: F403

# NOTE: tests run without `collectstatic`; production (`make run`) serves the hashed manifest.
STORAGES = {
    **STORAGES,  # noqa: F405
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
