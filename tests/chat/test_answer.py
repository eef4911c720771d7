"""chat.answer: routing a turn (the loop itself runs on the real engine in test_turn.py)."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from backends.models import InferenceBackend
from backends.routing import TurnShape
from chat.answer import choose_turn_route

# A turn the rules would send to a remote model if one were enabled.
COMPLEX_TURN = TurnShape(prompt_chars=100_000, num_passages=50)


def backend_queries(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries if "backends_inferencebackend" in query["sql"]]


@pytest.mark.django_db
def test_with_no_remote_backend_enabled_a_turn_is_routed_without_querying_the_backends_table():
    async_to_sync(choose_turn_route)(COMPLEX_TURN)  # the first turn of a process reads the table
    # NOTE: sync, so the route is chosen on this thread, on the captured connection.
    with CaptureQueriesContext(connection) as queries:
        route = async_to_sync(choose_turn_route)(COMPLEX_TURN)
    assert (route.is_remote, route.reason) == (False, "no_remote")
    assert backend_queries(queries) == []


@pytest.mark.django_db
def test_a_backend_enabled_since_the_last_turn_routes_the_next_one():
    assert not async_to_sync(choose_turn_route)(COMPLEX_TURN).is_remote
    InferenceBackend.objects.create(name="gpu-1", base_url="http://gpu-1/v1", model="big")
    route = async_to_sync(choose_turn_route)(COMPLEX_TURN)
    assert (route.model, route.is_remote, route.reason) == ("big", True, "long_prompt")
