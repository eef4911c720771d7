"""Cachet settings, read from the environment only (every variable is documented in the README).

A bad value stops start-up with `ImproperlyConfigured` naming the variable and what is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from chatsite import env
from inference import catalogue, model_files
from inference.engine import (
    CHUNK_KV_SELECTIONS,
    PREFILL_ATTENTION,
    PREFILL_WEIGHTS,
    resolve_device,
)
from inference.engine import ConfigError as EngineConfigError
from inference.engine_settings import engine_default

# NOTE: makes Django's generic classes subscriptable at run time (`ModelAdmin[Document]`), as
# django-stubs types them for mypy; done here, before any app module is imported.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent

try:
    DEBUG = env.read_bool(os.environ, "CACHET_DEBUG", default=False)
    SECRET_KEY = env.read_secret_key(os.environ, "CACHET_SECRET_KEY", debug=DEBUG)
    ALLOWED_HOSTS = env.read_list(
        os.environ, "CACHET_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"]
    )
    DATA_DIR = env.read_directory(os.environ, "CACHET_DATA_DIR", default=BASE_DIR / "var")
    DATABASE_URL = env.read_database_url(
        os.environ, "DATABASE_URL", default=f"sqlite:///{DATA_DIR / 'cachet.sqlite3'}"
    )
    REDIS_URL = env.read_redis_url(os.environ, "REDIS_URL")
    # A catalogue name (inference/catalogue.py), a hub id, a directory or a .gguf file.
    CACHET_MODEL = env.read_model_source(
        os.environ,
        "CACHET_MODEL",
        default=catalogue.DEFAULT_CHAT_MODEL,
        catalogue=catalogue.CATALOGUE,
    )
    # Where catalogue models are fetched to: outside the repository, so clones and CI share it.
    CACHET_MODEL_CACHE = env.read_directory(
        os.environ, "CACHET_MODEL_CACHE", default=catalogue.default_cache_dir(os.environ)
    )
    # A packaged model's name (inference/model_files.py), a hub id or a directory. Switching
    # re-embeds the search index at the next start (retrieval/consistency.py).
    CACHET_EMBEDDING_MODEL = env.read_model_source(
        os.environ,
        "CACHET_EMBEDDING_MODEL",
        default=model_files.DEFAULT_EMBEDDING_MODEL,
        catalogue=tuple(model_files.PACKAGED_EMBEDDING_MODELS),
    )
    CACHET_METRICS_TOKEN = env.read_str(os.environ, "CACHET_METRICS_TOKEN")
    # How often the staff dashboard samples this process's metrics (inference/metrics_history.py).
    CACHET_DASHBOARD_SAMPLE_S = env.read_int(
        os.environ, "CACHET_DASHBOARD_SAMPLE_S", default=5, minimum=1
    )
    # --- Engine (inference/engine_settings.py; the defaults are EngineConfig's) ---
    # The KV budget when no model configuration is active (an active one sets its own).
    CACHET_KV_CACHE_MB = env.read_int(
        os.environ, "CACHET_KV_CACHE_MB", default=int(engine_default("kv_cache_mb")), minimum=1
    )
    # 0: torch's default (one thread per core). 1 is often faster when the web server, the engine
    # and embedding share two cores (measured: see the README).
    CACHET_TORCH_THREADS = env.read_int(
        os.environ, "CACHET_TORCH_THREADS", default=engine_default("num_threads"), minimum=0
    )
    CACHET_ADAPTIVE_THREADS = env.read_bool(
        os.environ, "CACHET_ADAPTIVE_THREADS", default=engine_default("adaptive_threads")
    )
    CACHET_NATIVE_KERNELS = env.read_bool(
        os.environ, "CACHET_NATIVE_KERNELS", default=engine_default("native_kernels")
    )
    CACHET_FUSED_DECODE = env.read_bool(
        os.environ, "CACHET_FUSED_DECODE", default=engine_default("fused_decode")
    )
    # The prefix cache's disk tier: reused KV blocks kept on disk so a restart starts warm
    # (inference/engine/kv_disk_cache.py); "off" keeps the prefix cache in memory only.
    CACHET_KV_DISK_CACHE_DIR = env.read_optional_directory(
        os.environ, "CACHET_KV_DISK_CACHE_DIR", default=DATA_DIR / "kv-cache"
    )
    CACHET_KV_DISK_CACHE_MB = env.read_int(
        os.environ,
        "CACHET_KV_DISK_CACHE_MB",
        default=int(engine_default("kv_disk_cache_mb")),
        minimum=1,
    )
    # Chunk-KV reuse: a retrieved passage's keys/values computed once (after the system prompt)
    # and reused wherever a later prompt quotes it, the first tokens of each recomputed
    # (inference/engine/core/chunk_reuse.py). Approximate: off unless chosen; see the README.
    CACHET_CHUNK_KV_REUSE = env.read_bool(
        os.environ, "CACHET_CHUNK_KV_REUSE", default=engine_default("chunk_kv_reuse")
    )
    CACHET_CHUNK_KV_RECOMPUTE_TOKENS = env.read_int(
        os.environ,
        "CACHET_CHUNK_KV_RECOMPUTE_TOKENS",
        default=engine_default("chunk_kv_recompute_tokens"),
        minimum=0,
    )
    # Which tokens of a reused passage are recomputed: "deviation" (those the prompt's context
    # changes most at an early layer) or "leading" (its first ones).
    CACHET_CHUNK_KV_SELECTION = env.read_choice(
        os.environ,
        "CACHET_CHUNK_KV_SELECTION",
        default=engine_default("chunk_kv_selection"),
        choices=CHUNK_KV_SELECTIONS,
    )
    # Quantized layers' weights for prefill-sized steps: "dense" keeps a copy in the model dtype
    # (one GEMM a step, more memory), "quantized" dequantizes each step, "auto" is dense on CPUs
    # with AMX where the copy fits (inference/engine/model_runner.py).
    CACHET_PREFILL_WEIGHTS = env.read_choice(
        os.environ,
        "CACHET_PREFILL_WEIGHTS",
        default=engine_default("prefill_weights"),
        choices=PREFILL_WEIGHTS,
    )
    # Prefill chunks' attention: "native" (the paged kernel), "pytorch" (gather + flash
    # attention), "auto": native on CPUs with AVX-512 BF16 and no AMX (model_runner.py).
    CACHET_PREFILL_ATTENTION = env.read_choice(
        os.environ,
        "CACHET_PREFILL_ATTENTION",
        default=engine_default("prefill_attention"),
        choices=PREFILL_ATTENTION,
    )
    # The engine's device: "cpu" (default), "cuda" / "cuda:N", or "auto" (cuda where PyTorch
    # sees one). Checked here, so a missing GPU stops the start with the reason.
    CACHET_DEVICE = env.read_str(os.environ, "CACHET_DEVICE", default=engine_default("device"))
    try:
        CACHET_DEVICE = resolve_device(CACHET_DEVICE)
    except EngineConfigError as error:
        raise env.ConfigError("CACHET_DEVICE", str(error)) from None
    # --- end Engine ---
    CACHET_START_ENGINE = env.read_bool(os.environ, "CACHET_START_ENGINE", default=True)
    # Served over HTTPS (usually behind a TLS-terminating proxy): secure cookies, HSTS, redirects.
    CACHET_HTTPS = env.read_bool(os.environ, "CACHET_HTTPS", default=False)
    # "user": each user's prompts get their own prefix-cache blocks (no cross-user cache hits,
    # so no timing side channel between users); "shared" (default) lets every chat reuse the
    # cached system prompt.
    CACHET_CACHE_ISOLATION = env.read_choice(
        os.environ, "CACHET_CACHE_ISOLATION", default="shared", choices=("shared", "user")
    )
    CSRF_TRUSTED_ORIGINS = env.read_list(os.environ, "CACHET_CSRF_TRUSTED_ORIGINS", default=[])
    # --- Retrieval (retrieval/; defaults measured, see the README's "Retrieval" section) ---
    CACHET_MAX_UPLOAD_MB = env.read_int(os.environ, "CACHET_MAX_UPLOAD_MB", default=50, minimum=1)
    CACHET_MAX_UNPACKED_MB = env.read_int(
        os.environ, "CACHET_MAX_UNPACKED_MB", default=100, minimum=1
    )
    CACHET_MAX_PDF_PAGES = env.read_int(os.environ, "CACHET_MAX_PDF_PAGES", default=5000, minimum=1)
    CACHET_EXTRACT_TIMEOUT_S = env.read_int(
        os.environ, "CACHET_EXTRACT_TIMEOUT_S", default=300, minimum=1
    )
    CACHET_CHUNK_TOKENS = env.read_int(os.environ, "CACHET_CHUNK_TOKENS", default=200, minimum=16)
    CACHET_CHUNK_OVERLAP = env.read_int(os.environ, "CACHET_CHUNK_OVERLAP", default=30, minimum=0)
    CACHET_SEARCH_TOP_K = env.read_int(os.environ, "CACHET_SEARCH_TOP_K", default=5, minimum=1)
    CACHET_SEARCH_CANDIDATES = env.read_int(
        os.environ, "CACHET_SEARCH_CANDIDATES", default=50, minimum=1
    )
    CACHET_RERANKER = env.read_str(os.environ, "CACHET_RERANKER", default="fusion")
    if not (
        CACHET_RERANKER in {"none", "fusion"}
        or (CACHET_RERANKER.startswith("cross-encoder:") and CACHET_RERANKER[14:].strip())
    ):
        raise env.ConfigError(
            "CACHET_RERANKER",
            "expected none, fusion or cross-encoder:<model id or directory>; "
            f"got {CACHET_RERANKER!r}",
        )
    # Where the vectors live (retrieval/vector_store.py): "auto" picks pgvector on PostgreSQL with
    # the vector extension, the faiss file otherwise.
    CACHET_VECTOR_STORE = env.read_choice(
        os.environ, "CACHET_VECTOR_STORE", default="auto", choices=("auto", "faiss", "pgvector")
    )
    if CACHET_CHUNK_OVERLAP * 2 >= CACHET_CHUNK_TOKENS:
        raise env.ConfigError("CACHET_CHUNK_OVERLAP", "must be under half of CACHET_CHUNK_TOKENS")
    # Where BM25 runs (retrieval/lexical_store.py): "auto" picks PostgreSQL's inverted index on
    # PostgreSQL and in-process bm25s on SQLite.
    CACHET_LEXICAL_STORE = env.read_choice(
        os.environ, "CACHET_LEXICAL_STORE", default="auto", choices=("auto", "bm25s", "postgresql")
    )
    if CACHET_LEXICAL_STORE == "postgresql" and DATABASE_URL.startswith("sqlite"):
        raise env.ConfigError(
            "CACHET_LEXICAL_STORE", "postgresql needs a PostgreSQL DATABASE_URL; this is SQLite"
        )
    # --- end Retrieval ---
    # --- Chat (chat/) ---
    CACHET_MAX_MESSAGE_CHARS = env.read_int(
        os.environ, "CACHET_MAX_MESSAGE_CHARS", default=8000, minimum=1
    )
    # --- end Chat ---
    # --- Backends and routing (backends/; rules in docs/scale-out.md) ---
    # A remote replica that failed is skipped for this long, then tried again.
    CACHET_BACKEND_RETRY_S = env.read_int(
        os.environ, "CACHET_BACKEND_RETRY_S", default=30, minimum=1
    )
    # The longest a remote backend may stay silent (waiting for headers or the next token).
    CACHET_BACKEND_TIMEOUT_S = env.read_int(
        os.environ, "CACHET_BACKEND_TIMEOUT_S", default=120, minimum=1
    )
    # Automatic routing: a turn this long (characters of history, passages and question), or with
    # this many passages, goes to the remote model when one is configured.
    CACHET_ROUTE_PROMPT_CHARS = env.read_int(
        os.environ, "CACHET_ROUTE_PROMPT_CHARS", default=6000, minimum=1
    )
    CACHET_ROUTE_PASSAGES = env.read_int(os.environ, "CACHET_ROUTE_PASSAGES", default=8, minimum=1)
    # How a request picks a replica of a remote model: by its conversation's opening (prefix
    # caches stay warm) or at random by weight (backends.replicas).
    CACHET_ROUTING = env.read_choice(
        os.environ, "CACHET_ROUTING", default="prefix", choices=("prefix", "random")
    )
    # --- end Backends ---
    # The most tokens one API request may ask to generate (its default is 256, or this if lower).
    CACHET_API_MAX_TOKENS = env.read_int(
        os.environ, "CACHET_API_MAX_TOKENS", default=4096, minimum=1
    )
    # Requests the engine may hold (queued + running) before the REST API answers 503.
    CACHET_API_MAX_PENDING = env.read_int(
        os.environ, "CACHET_API_MAX_PENDING", default=512, minimum=1
    )
    # --- API (api/) ---
    CACHET_API_REQUESTS_PER_MINUTE = env.read_int(
        os.environ, "CACHET_API_REQUESTS_PER_MINUTE", default=60, minimum=1
    )
    CACHET_API_TOKENS_PER_MINUTE = env.read_int(
        os.environ, "CACHET_API_TOKENS_PER_MINUTE", default=100000, minimum=1
    )
    CACHET_BOOTSTRAP_API_KEY = env.read_str(os.environ, "CACHET_BOOTSTRAP_API_KEY")
    CACHET_BOOTSTRAP_API_USER = env.read_str(os.environ, "CACHET_BOOTSTRAP_API_USER", default="api")
    # NOTE: it is stored as a fast hash (see api.models.hash_key), so it must be unguessable.
    if (
        CACHET_BOOTSTRAP_API_KEY is not None
        and len(CACHET_BOOTSTRAP_API_KEY) < env.MIN_SECRET_KEY_LENGTH
    ):
        raise env.ConfigError(
            "CACHET_BOOTSTRAP_API_KEY",
            f"must be at least {env.MIN_SECRET_KEY_LENGTH} characters (use a long random "
            f"string); got {len(CACHET_BOOTSTRAP_API_KEY)}",
        )
    if CACHET_BOOTSTRAP_API_KEY is not None and len(CACHET_BOOTSTRAP_API_KEY.split()) > 1:
        # A Bearer token is one word; a key with spaces could never be sent.
        raise env.ConfigError("CACHET_BOOTSTRAP_API_KEY", "must not contain spaces")
    # --- end API ---
except env.ConfigError as error:
    raise ImproperlyConfigured(f"Bad setting {error}") from None

DATA_DIR.mkdir(parents=True, exist_ok=True)
MODELS_DIR = DATA_DIR / "models"
MEDIA_ROOT = DATA_DIR / "media"
MEDIA_URL = "/media/"

INSTALLED_APPS = [
    # NOTE: daphne first so its `runserver` (ASGI, WebSockets) replaces Django's.
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "inference",
    "retrieval",
    "chat",
    "api",
    "backends",
    "frontend",
    "evals",
    "ninja",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # NOTE: daphne serves no static files; WhiteNoise serves the admin's and ours in production.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # NOTE: after the session, before CommonMiddleware (Django's order): the language comes from
    # set_language's cookie, else the browser's Accept-Language, else LANGUAGE_CODE.
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # NOTE: the engine thread, daphne and in-process Celery tasks write concurrently; WAL and a
    # busy timeout turn "database is locked" into short waits.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if REDIS_URL:
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # NOTE: a consumer waits for messages with BZPOPMIN, 5 s at a time; redis-py's
            # default read timeout is also 5 s, so an idle wait timed out and the error closed
            # the WebSocket (1011) after 5 s without a message. Reads get more than the 5 s;
            # connecting fails fast while Redis is down; one immediate retry replaces a pooled
            # connection that a Redis restart broke (else its next user fails once).
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        "socket_timeout": 15,
                        "socket_connect_timeout": 3,
                        "retry": Retry(NoBackoff(), 1),
                    }
                ]
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Celery: with Redis, a real broker and result backend; without it, tasks run in-process so the
# embedded set-up needs no extra services.
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = REDIS_URL or "cache+memory://"
CELERY_TASK_ALWAYS_EAGER = REDIS_URL is None
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
# The interface's languages (README, "Languages"); translations in locale/, compiled .mo committed.
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = DATA_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # WhiteNoise's compressed manifest, with ES module imports rewritten to the hashed names.
    "staticfiles": {"BACKEND": "chatsite.storage.HashedStaticFilesStorage"},
}
# NOTE: without `collectstatic` (tests, first start) fall back to unhashed names, not a 500.
WHITENOISE_MANIFEST_STRICT = False
if DEBUG:
    STORAGES["staticfiles"] = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# NOTE: session storage, so a message carrying a secret (an API key shown once) never travels in
# a cookie.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
if CACHET_HTTPS:
    SECURE_SSL_REDIRECT = True
    # NOTE: the proxy in front terminates TLS and says so in this header (see the README).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = 31_536_000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {"django": {"level": "INFO", "propagate": True}},
}
