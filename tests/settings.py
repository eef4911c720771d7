"""Settings for the test suite: the production settings with test-only defaults for secrets."""

import os

# NOTE: setdefault, so CI can still run the suite against PostgreSQL and Redis through the
# environment, exactly as production reads it.
os.environ.setdefault("CACHET_SECRET_KEY", "cachet-test-suite-only-secret-key-not-for-production")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The suite serves the bundled 135M model, which loads in seconds (not the app's default): in the
# environment, so the servers that tests start as subprocesses serve it too.
os.environ.setdefault("CACHET_MODEL", "smollm2-135m-instruct")
# The KV disk tier stays off unless a test turns it on: the suite's servers share one data dir,
# and blocks one test left on disk would make another's first request warm.
os.environ.setdefault("CACHET_KV_DISK_CACHE_DIR", "off")

from chatsite.settings import *  # noqa: F403

# NOTE: tests run without `collectstatic`; production (`make run`) serves the hashed manifest.
STORAGES = {
    **STORAGES,  # noqa: F405
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# NOTE: the prepared model directories (config and tokenizer converted once from each GGUF: ~40 s
# for the catalogue's four) live beside the models cache, outside the checkout, so fresh clones
# and CI runs reuse them as they reuse the models; each is checked against its GGUF on use.
MODELS_DIR = CACHET_MODEL_CACHE.parent / "prepared-for-tests"  # noqa: F405
