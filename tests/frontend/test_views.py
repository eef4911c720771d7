"""frontend.views: the chat page, log-in and log-out, the JavaScript catalog (a document's page:
test_documents.py)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from chat.models import Conversation

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="pw-alice")


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_chat_page_needs_a_login_and_sets_the_csrf_cookie(client, alice):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=/")
    client.force_login(alice)
    response = client.get("/")
    assert response.status_code == 200
    assert b'id="chat-config"' in response.content
    assert "csrftoken" in response.cookies


def test_logging_in_with_the_form_leads_to_the_chat(client, alice):
    page = client.get("/login/")
    assert page.status_code == 200 and b'name="username"' in page.content
    response = client.post("/login/", {"username": "alice", "password": "pw-alice"})
    assert response.status_code == 302 and response["Location"] == "/"
    refused = Client().post("/login/", {"username": "alice", "password": "wrong"})
    assert refused.status_code == 200 and b"correct username and password" in refused.content


def test_logout_is_a_post(alice):
    client = logged_in(alice)
    assert client.get("/logout/").status_code == 405
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


def test_a_conversation_page_opens_only_for_its_owner(alice):
    mine = Conversation.objects.create(owner=alice)
    theirs = Conversation.objects.create(owner=User.objects.create_user("bob"))
    client = logged_in(alice)
    assert client.get(f"/c/{mine.pk}/").status_code == 200
    assert client.get(f"/c/{theirs.pk}/").status_code == 404
    assert client.get("/c/987654/").status_code == 404


def test_the_chat_page_loads_the_javascript_catalog_of_its_language_before_its_modules(alice):
    client = logged_in(alice)
    for accept_language, language in (("en-US", "en"), ("zh-CN,zh;q=0.9", "zh-hans")):
        page = client.get("/", headers={"accept-language": accept_language}).content.decode()
        catalog = re.search(rf'<script src="(/jsi18n/{language}/\?v=[0-9a-f]{{12}})" defer>', page)
        assert catalog, f"no {language} catalog on the page"
        assert page.index(catalog[0]) < page.index('<script type="module"')
        assert client.get(catalog[1]).status_code == 200


def test_the_javascript_catalog_is_the_languages_in_its_url_and_cached_for_good(client):
    chinese = client.get("/jsi18n/zh-hans/", headers={"accept-language": "en"})
    assert chinese.status_code == 200
    assert chinese["Content-Type"].startswith("text/javascript")
    assert chinese["Content-Language"] == "zh-hans"
    assert "max-age=31536000" in chinese["Cache-Control"]
    assert "immutable" in chinese["Cache-Control"]
    body = chinese.content.decode()
    assert '"\\u9996\\u5b57\\u5ef6\\u8fdf' in body or "首字延迟" in body  # "TTFT" in Chinese
    english = client.get("/jsi18n/en/", headers={"accept-language": "zh-CN"}).content.decode()
    assert "首字延迟" not in english and "\\u9996\\u5b57" not in english
    assert client.get("/jsi18n/fr/").status_code == 404
