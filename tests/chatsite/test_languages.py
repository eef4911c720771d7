"""The interface language: LocaleMiddleware picks it from the language cookie, else the browser's
Accept-Language, else English; set_language switches it (POST, CSRF-checked); /v1 stays English."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from api.models import ApiKey
from inference.models import ModelConfig
from retrieval.models import Collection, Document

pytestmark = pytest.mark.django_db


def html_lang(response) -> str:
    match = re.search(rb'<html lang="([^"]+)">', response.content)
    assert match, "no <html lang> on the page"
    return match[1].decode()


@pytest.mark.parametrize("accept_language", ["zh-CN,zh;q=0.9,en;q=0.8", "zh", "zh-Hans"])
def test_a_browser_that_prefers_chinese_gets_the_login_page_in_chinese(accept_language):
    response = Client(headers={"accept-language": accept_language}).get("/login/")
    assert response.status_code == 200
    assert html_lang(response) == "zh-hans"
    assert response["Content-Language"] == "zh-hans"
    page = response.content.decode()
    assert "登录后即可与你的文档对话。" in page and "<title>登录 · Cachet</title>" in page
    assert "Sign in" not in page


@pytest.mark.parametrize("accept_language", [None, "en-US,en;q=0.9", "fr-FR,de;q=0.8"])
def test_english_is_the_language_when_the_browser_asks_for_english_nothing_or_another(
    accept_language,
):
    headers = {"accept-language": accept_language} if accept_language else {}
    response = Client(headers=headers).get("/login/")
    assert html_lang(response) == "en"
    assert "Sign in to chat with your documents." in response.content.decode()


def test_the_switch_sets_the_language_cookie_which_wins_over_accept_language():
    client = Client(headers={"accept-language": "zh-CN"})
    assert html_lang(client.get("/login/")) == "zh-hans"
    response = client.post("/i18n/setlang/", {"language": "en", "next": "/login/?next=/c/3/"})
    assert response.status_code == 302 and response["Location"] == "/login/?next=/c/3/"
    assert client.cookies[settings.LANGUAGE_COOKIE_NAME].value == "en"
    assert html_lang(client.get("/login/")) == "en"

    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/login/"})
    assert html_lang(client.get("/login/")) == "zh-hans"


def test_the_switch_needs_a_csrf_token_and_ignores_unknown_languages_and_foreign_next_urls():
    client = Client(enforce_csrf_checks=True)
    assert client.post("/i18n/setlang/", {"language": "zh-hans"}).status_code == 403
    assert settings.LANGUAGE_COOKIE_NAME not in client.cookies

    client = Client()
    response = client.post("/i18n/setlang/", {"language": "xx", "next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert settings.LANGUAGE_COOKIE_NAME not in client.cookies


def test_both_pages_show_the_switch_with_the_current_language_marked():
    client = Client(headers={"accept-language": "zh-CN"})
    login = client.get("/login/").content.decode()
    client.force_login(User.objects.create_user("alice"))
    chat = client.get("/").content.decode()
    for page in (login, chat):
        form = re.search(r'<form class="language-switch".*?</form>', page, re.S)
        assert form, "no language switch"
        assert 'action="/i18n/setlang/"' in form[0] and "csrfmiddlewaretoken" in form[0]
        buttons = re.findall(r'name="language" value="([^"]+)"([^>]*)>', form[0])
        assert [code for code, attributes in buttons if 'aria-current="true"' in attributes] == [
            "zh-hans"
        ]
        assert ">English</button>" in form[0] and ">简体中文</button>" in form[0]


def test_the_api_answers_in_english_whatever_the_browser_prefers():
    response = Client(headers={"accept-language": "zh-CN"}).post(
        "/v1/chat/completions", data="{}", content_type="application/json"
    )
    assert response.status_code == 401
    body = response.json()
    assert body["error"]["message"].isascii(), body


def test_the_admin_shows_cachets_own_models_actions_and_fields_in_chinese(admin_client):
    handbook = Collection.objects.create(name="Handbook")
    Document.objects.create(collection=handbook, title="handbook.md", file="handbook.md")
    chinese = {"accept-language": "zh-CN"}
    index = admin_client.get("/admin/", headers=chinese).content.decode()
    for name in ("聊天", "推理后端", "助手配置", "集合", "文档"):
        assert name in index, name
    documents = admin_client.get("/admin/retrieval/document/", headers=chinese).content.decode()
    for text in ("重新导入所选文档", "上传文件", "搜索预览", "状态", "进度", "排队中"):
        assert text in documents, text
    profile = admin_client.get("/admin/chat/assistantprofile/add/", headers=chinese)
    assert "系统提示词" in profile.content.decode() and "检索" in profile.content.decode()
    english = admin_client.get("/admin/retrieval/document/").content.decode()
    assert "Re-ingest selected documents" in english and "Upload files" in english


def test_translated_names_leave_no_migration_to_make():
    # NOTE: verbose names and choices are part of a model's migration state.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_the_admin_index_names_the_api_inference_and_retrieval_apps_in_chinese(admin_client):
    chinese = admin_client.get("/admin/", headers={"accept-language": "zh-CN"}).content.decode()
    for name in (">API 接口</a>", ">API 密钥</a>", ">推理</a>", ">模型配置</a>", ">检索</a>"):
        assert name in chinese, name
    english = admin_client.get("/admin/").content.decode()
    for name in (">API</a>", ">API keys</a>", ">Inference</a>", ">Model configurations</a>"):
        assert name in english, name
    assert ">Retrieval</a>" in english


def test_the_api_key_admin_speaks_chinese_down_to_the_key_shown_once(admin_client):
    owner = User.objects.create_user("robot", password="pw-robot-123456")
    ApiKey.create_for(owner, "nightly-export")
    chinese = {"accept-language": "zh-CN"}
    keys = admin_client.get("/admin/api/apikey/", headers=chinese).content.decode()
    # NOTE: Chinese punctuation is full-width, on purpose (RUF001).
    for text in ("吊销所选密钥", "前缀", "有效", "每分钟请求数", "（默认）", "提示词词元数"):  # noqa: RUF001
        assert text in keys, text
    form = admin_client.get("/admin/api/apikey/add/", headers=chinese).content.decode()
    assert "限额" in form and "此密钥代表该用户" in form
    added = admin_client.post(
        "/admin/api/apikey/add/",
        {"user": owner.pk, "name": "ci", "requests_per_minute": "", "tokens_per_minute": ""},
        headers=chinese,
        follow=True,
    ).content.decode()
    assert "请立即复制此密钥，它不会再次显示：ck-" in added  # noqa: RUF001
    revoked = admin_client.post(
        "/admin/api/apikey/",
        {"action": "revoke_selected", "_selected_action": [k.pk for k in ApiKey.objects.all()]},
        headers=chinese,
        follow=True,
    ).content.decode()
    assert "已吊销 2 个密钥。" in revoked
    english = admin_client.get("/admin/api/apikey/").content.decode()
    assert "Revoke selected keys" in english and "(default)" in english


def test_the_model_configuration_admin_speaks_chinese_and_english_by_default(admin_client):
    ModelConfig.objects.create(name="small")
    chinese = {"accept-language": "zh-CN"}
    configs = admin_client.get("/admin/inference/modelconfig/", headers=chinese).content.decode()
    for text in ("激活所选配置（将重新加载引擎）", "来源", "（默认：", "数据类型（dtype）"):  # noqa: RUF001
        assert text in configs, text
    form = admin_client.get("/admin/inference/modelconfig/add/", headers=chinese)
    page = form.content.decode()
    assert "自动（模型的数据类型）" in page  # noqa: RUF001
    for text in ("引擎", "速度", "草稿模型", "默认采样", "每步的草稿词元数"):
        assert text in page, text
    english = admin_client.get("/admin/inference/modelconfig/add/").content.decode()
    assert "Default sampling" in english and "auto (the model dtype)" in english
