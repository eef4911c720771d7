"""api.v1: the OpenAPI schema and docs page, and fuzzing every operation from that schema.

Schemathesis generates requests (valid and invalid) from the API's own OpenAPI schema and sends
them to a live server with a valid key: whatever it sends, the answer is never a 5xx.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.test import Client
from hypothesis import HealthCheck, settings

from api import v1
from harness.live_server import LiveServer

SETUP = """
from django.contrib.auth.models import User
from api.models import ApiKey
from retrieval.models import Collection

staff = User.objects.create_user("fuzzer", is_staff=True)
Collection.objects.create(name="HR")
_, key = ApiKey.create_for(staff, "fuzz", requests_per_minute=100000, tokens_per_minute=10**9)
print(key)
"""
# NOTE: answers are capped at 8 tokens, so a fuzzed request never generates for long.
SERVER_ENV = {"CACHET_API_MAX_TOKENS": "8", "CACHET_MAX_UPLOAD_MB": "1"}

schema = schemathesis.openapi.from_dict(v1.api.get_openapi_schema())


@pytest.fixture(scope="module")
def fuzz_server(chat_model_dir):
    with LiveServer(models_dir=chat_model_dir.parent, env=SERVER_ENV) as live:
        live.key = live.shell(SETUP).strip()
        live.start()
        yield live


@pytest.mark.django_db
def test_the_schema_and_the_interactive_docs_are_served_without_a_key() -> None:
    client = Client()
    schema_json = client.get("/v1/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models",
            "/v1/documents", "/v1/search", "/v1/collections",
            "/v1/collections/{collection_id}"} <= set(schema_json["paths"])  # fmt: skip
    assert schema_json["components"]["securitySchemes"]["ApiKeyAuth"]["scheme"] == "bearer"
    docs = client.get("/v1/docs")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content


@pytest.mark.real_weights
@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_request_generated_from_the_schema_gets_a_server_error(case, fuzz_server) -> None:
    response = case.call(
        base_url=fuzz_server.url,
        headers={"Authorization": f"Bearer {fuzz_server.key}"},
        timeout=120,
    )
    assert response.status_code < 500, (case.method, case.path, response.text[:500])
