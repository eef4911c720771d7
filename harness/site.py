"""One site set-up for every run against a live server: models, users, a profile, a key, documents.

The chat benchmark, the API benchmark, the reliability suites and the fault tests each need a
few rows before the server starts: users logged in with a session, an assistant profile, an API
key whose limits no run reaches, sometimes a model configuration or an ingested document. They
all ask for them here, with a spec that names what they need:

    site = server.call("harness.site:prepare_site", {"label": "bench", "profile": {...}})

NOTE: `prepare_site` and `cleanup_site` run in a Django shell of the server's settings
(`LiveServer.call`), not in the caller's process: Django reads its settings once per process,
and the caller (the test suite) may already have set up Django on other settings. So every
Django import is inside the functions, and specs and results are plain JSON.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

SITE_TIMEOUT_S = 900.0  # `LiveServer.call`'s: includes converting the chat model on a fresh clone
# The API key's limits: far above what a run uses, so no request is refused for them.
KEY_REQUESTS_PER_MINUTE = 1_000_000
KEY_TOKENS_PER_MINUTE = 1_000_000_000


class SiteError(RuntimeError):
    """The site could not be set up as the spec asks (a document failed to ingest...)."""


def prepare_site(spec: dict[str, Any]) -> dict[str, Any]:
    """Prepare the models and add the rows `spec` asks for; what a client needs to use them.

    `spec` (every key optional):
    - `label`: names the rows ("bench", "reliability"...; default "harness");
    - `users`: how many users, each with a logged-in session (default 1); `user`: their User
      fields (`first_name`...);
    - `profile`: AssistantProfile fields (`system_prompt`, `temperature`...); None: no profile;
    - `model_config`: ModelConfig fields of a new configuration, activated; `kv_cache_mb: "min"`
      takes the smallest budget that holds one `max_model_len` sequence;
    - `api_key`: true for a user of its own with an API key of limits no run reaches;
    - `document`: `{"title", "file_name", "text"}`, ingested into a collection the users read and
      the profile searches;
    - `engine_config`: true for the engine settings the server will load (`EngineConfig` fields);
    - `backends`: InferenceBackend fields of remote backends to add (other servers as replicas).
    """
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.test import Client

    from chat.models import AssistantProfile
    from inference.model_files import resolve_chat_model, resolve_embedding_model

    # NOTE: fetches (a catalogue model) and converts the configured model once on a fresh clone,
    # into the shared caches (<data dir>/models links to the converted one); afterwards the server
    # finds it cached.
    chat_model = resolve_chat_model(
        settings.CACHET_MODEL, settings.MODELS_DIR, model_cache=settings.CACHET_MODEL_CACHE
    )
    resolve_embedding_model(settings.CACHET_EMBEDDING_MODEL)
    label = spec.get("label", "harness")
    token = secrets.token_hex(4)
    site: dict[str, Any] = {
        "cookie_name": settings.SESSION_COOKIE_NAME,
        "chat_model_dir": str(chat_model.directory),
        "chat_model_action": chat_model.action,
    }
    if "model_config" in spec:
        hf_config = json.loads((chat_model.directory / "config.json").read_text())
        site |= _activate_model_config(spec["model_config"] or {}, hf_config, f"{label}-{token}")

    users = [
        User.objects.create_user(f"{label}-{token}-{index}", **(spec.get("user") or {}))
        for index in range(spec.get("users", 1))
    ]
    site["user_ids"] = [user.pk for user in users]
    site["sessions"] = [_session_of(Client(), user, settings.SESSION_COOKIE_NAME) for user in users]

    profile = None
    if spec.get("profile") is not None:
        profile = AssistantProfile.objects.create(name=f"{label} {token}", **spec["profile"])
    site["profile_id"] = profile.pk if profile is not None else None

    site["collection_ids"], site["document_chunks"] = [], 0
    if spec.get("document"):
        collection_id, num_chunks = _ingest(spec["document"], f"{label} {token}", users, profile)
        site["collection_ids"], site["document_chunks"] = [collection_id], num_chunks

    site["api_user_id"], site["api_key"] = None, None
    if spec.get("api_key"):
        site["api_user_id"], site["api_key"] = _api_key(f"{label}-api-{token}", label)

    site["backend_ids"] = _add_backends(spec.get("backends") or [])
    site |= _served_model(engine_config=bool(spec.get("engine_config")))
    return site


def add_api_keys(label: str, count: int) -> dict[str, Any]:
    """`count` API keys, each of a user of its own, and the served model's name: for a server
    that other servers use as a remote backend. Own users, so each key's requests have their own
    prefix-cache salt when the server runs with CACHET_CACHE_ISOLATION=user."""
    token = secrets.token_hex(4)
    keys = [_api_key(f"{label}-api-{token}-{index}", label)[1] for index in range(count)]
    return {"api_keys": keys} | _served_model(engine_config=False)


def cleanup_site(site: dict[str, Any]) -> dict[str, bool]:
    """Delete the rows `prepare_site` added (for a database that outlives the run).

    A model configuration it activated stays: which one was active before is not known here.
    """
    from django.contrib.auth.models import User
    from django.contrib.sessions.models import Session

    from backends.models import InferenceBackend
    from chat.models import AssistantProfile
    from retrieval.models import Collection

    InferenceBackend.objects.filter(pk__in=site.get("backend_ids", [])).delete()
    Collection.objects.filter(pk__in=site["collection_ids"]).delete()
    if site["profile_id"] is not None:
        AssistantProfile.objects.filter(pk=site["profile_id"]).delete()
    user_ids = [*site["user_ids"], *([site["api_user_id"]] if site["api_user_id"] else [])]
    User.objects.filter(pk__in=user_ids).delete()  # their conversations and keys go with them
    Session.objects.filter(session_key__in=site["sessions"]).delete()
    return {"deleted": True}


def _session_of(client: Any, user: Any, cookie_name: str) -> str:
    client.force_login(user)
    return client.cookies[cookie_name].value


def _activate_model_config(fields: dict[str, Any], hf_config: dict, name: str) -> dict[str, Any]:
    """A new ModelConfig of `fields`, validated and activated; its settings and KV cache's size."""
    from inference.models import ModelConfig

    config = ModelConfig(name=name)
    for field, value in fields.items():
        if field != "kv_cache_mb":
            setattr(config, field, value)
    min_mb = config.min_kv_cache_mb(hf_config)
    kv_mb = fields.get("kv_cache_mb", config.kv_cache_mb)
    config.kv_cache_mb = min_mb if kv_mb == "min" else int(kv_mb)
    config.full_clean()  # refuses what the engine could not load, with the reason
    config.activate()

    num_blocks = config.kv_cache_mb * 2**20 // config.kv_cache_spec(hf_config).bytes_per_block
    return {
        "model_config": {
            "dtype": config.dtype,
            "max_model_len": config.max_model_len,
            "kv_cache_mb": config.kv_cache_mb,
            "min_kv_cache_mb": min_mb,
            "block_size": config.block_size,
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
        },
        "kv_blocks": num_blocks,
        "kv_tokens": num_blocks * config.block_size,
    }


def _ingest(document: dict[str, str], name: str, readers: list, profile: Any) -> tuple[int, int]:
    """`document` ingested into a new collection of `readers`; its id and number of chunks."""
    from django.core.files.base import ContentFile

    from retrieval.ingest import ingest
    from retrieval.models import Collection, Document
    from retrieval.search import get_retriever

    collection = Collection.objects.create(name=name)
    collection.readers.add(*readers)
    if profile is not None:
        profile.collections.add(collection)
    row = Document.objects.create(
        collection=collection,
        title=document["title"],
        file=ContentFile(document["text"].encode(), name=document["file_name"]),
        created_by=readers[0] if readers else None,
    )
    ingested = ingest(row.pk, get_retriever())
    if ingested is None or ingested.status != Document.Status.READY:
        reason = ingested.error if ingested is not None else "the document vanished"
        raise SiteError(f"ingesting {document['title']!r} failed: {reason}")
    return collection.pk, ingested.chunks.count()


def _add_backends(backends: list[dict[str, Any]]) -> list[int]:
    from backends.models import InferenceBackend

    return [InferenceBackend.objects.create(**fields).pk for fields in backends]


def _api_key(username: str, key_name: str) -> tuple[int, str]:
    """A user of its own with an API key of limits no run reaches; its id and the raw key."""
    from django.contrib.auth.models import User

    from api.models import ApiKey

    user = User.objects.create_user(username)
    _, raw_key = ApiKey.create_for(
        user,
        key_name,
        requests_per_minute=KEY_REQUESTS_PER_MINUTE,
        tokens_per_minute=KEY_TOKENS_PER_MINUTE,
    )
    return user.pk, raw_key


def _served_model(*, engine_config: bool) -> dict[str, Any]:
    """The served model's name and, if asked, the engine settings the server will load."""
    import dataclasses
    from pathlib import PurePath

    from django.conf import settings

    from inference.models import ModelConfig
    from inference.runtime import engine_config_for, served_model_name

    active = ModelConfig.active()
    served: dict[str, Any] = {"model": served_model_name(active)}
    if engine_config:
        config = engine_config_for(active)
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        # NOTE: every directory (the model's, the draft's, the disk KV tier's) as a string: the
        # spec's answer goes through JSON.
        fields = {k: str(v) if isinstance(v, PurePath) else v for k, v in fields.items()}
        fields["dtype"] = str(config.dtype).removeprefix("torch.")
        served |= {"engine_config": fields, "torch_threads": settings.CACHET_TORCH_THREADS}
    return served
