"""frontend.retrieval_test: the staff page that shows a query's whole candidate pool (real
embedder, real BM25 and index), closed to everyone else and linked for staff only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from retrieval.ingest import ingest
from retrieval.models import Collection
from tests.documents import HANDBOOK, KITCHEN, add_document

pytestmark = pytest.mark.django_db
PAGE = "/staff/retrieval/"


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def staff() -> Client:
    return logged_in(User.objects.create_user("staff", is_staff=True))


def test_only_staff_open_it_and_only_staff_see_the_link(staff) -> None:
    reader = User.objects.create_user("reader")
    Collection.objects.create(name="hr").readers.add(reader)
    assert logged_in(reader).get(PAGE, {"query": "holiday"}).status_code == 403
    assert Client().get(PAGE).status_code == 302
    assert PAGE not in logged_in(reader).get("/").content.decode()
    assert staff.get(PAGE).status_code == 200
    assert f'href="{PAGE}"' in staff.get("/").content.decode()


def test_every_candidate_shows_its_scores_ranks_and_the_cutoff(staff, retriever) -> None:
    hr = Collection.objects.create(name="hr")
    ops = Collection.objects.create(name="ops")
    ingest(add_document(hr, "handbook.md", HANDBOOK).pk, retriever)
    ingest(add_document(ops, "kitchen.txt", KITCHEN).pk, retriever)
    response = staff.get(PAGE, {"query": "paid holiday days", "collections": [hr.pk], "top_k": 1})
    explanation = response.context["explanation"]
    assert len(explanation.pool) == 2  # the handbook's two sections; the kitchen is not chosen
    page = response.content.decode()
    assert page.count('class="candidate kept"') == 1
    assert page.count('class="candidate dropped"') == 1
    cutoff = page.index('id="cutoff-row"')
    assert page.index("candidate kept") < cutoff < page.index('class="candidate dropped"')
    top = explanation.pool[0]
    assert "thirty days" in top.hit.text
    for value in (top.lexical_score, top.dense_score, top.fused_score, top.hit.score):
        assert f"{value:.4f}" in page
    assert f"#{top.lexical_rank}" in page
    assert explanation.cutoff_reason in page.replace("&#x27;", "'")
    assert f'href="/documents/{top.hit.document_id}/?chunk={top.hit.chunk_id}#chunk-' in page
    assert "kitchen.txt" not in page


def test_bad_input_is_shown_on_the_form_and_runs_nothing(staff) -> None:
    response = staff.get(PAGE, {"query": "", "top_k": "0", "mode": "magic"})
    assert response.status_code == 200 and response.context["explanation"] is None
    form = response.context["form"]
    assert {"query", "top_k", "mode"} <= set(form.errors)


def test_the_admins_search_preview_links_to_the_whole_pool(admin_client, retriever) -> None:
    hr = Collection.objects.create(name="hr")
    ingest(add_document(hr, "handbook.md", HANDBOOK).pk, retriever)
    response = admin_client.get(
        "/admin/retrieval/document/search/", {"query": "paid holiday", "top_k": 1}
    )
    page = response.content.decode()
    assert f'href="{PAGE}?query=paid+holiday&amp;top_k=1"' in page
    assert response.context["explanation"].cutoff_reason.split(":")[0] in page
    assert admin_client.get(f"{PAGE}?query=paid+holiday&top_k=1").status_code == 200
