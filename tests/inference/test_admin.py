"""The model-configuration admin: staff edit, validation shows the reason, activation reloads."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model

from inference import catalogue, runtime
from inference.models import APP_FIELDS, ModelConfig

pytestmark = pytest.mark.django_db(transaction=True)

ADD_URL = "/admin/inference/modelconfig/add/"
FORM = {
    "name": "smaller",
    "source": "",
    "dtype": "bfloat16",
    "max_model_len": 2048,
    "kv_cache_mb": 128,
    "block_size": 16,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 256,
    "enable_prefix_caching": "on",
    "quantization": "int8",
    "quantization_group_size": 32,
    "kv_cache_dtype": "auto",
    "num_speculative_tokens": 2,
    "speculative_method": "ngram",
    "draft_source": "",
    "draft_kv_cache_mb": "",
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": "",
    "max_tokens": 256,
}


@pytest.fixture
def staff_client(client):
    get_user_model().objects.create_superuser("root", password="pw-root-123456")
    client.login(username="root", password="pw-root-123456")
    return client


@pytest.fixture(autouse=True)
def no_engine_left_behind():
    yield
    runtime.stop_engine()


def test_the_engine_sections_show_every_engine_setting_and_the_others_every_app_field() -> None:
    sections = dict(admin.site._registry[ModelConfig].fieldsets)
    engine_fields = [*sections["Engine"]["fields"], *sections["Speed"]["fields"]]
    assert sorted(engine_fields) == sorted(ModelConfig.engine_field_names())
    app_fields = {
        field
        for title, options in sections.items()
        if title not in {"Engine", "Speed"}
        for field in options["fields"]
    }
    assert app_fields == APP_FIELDS - {"id"}


def test_non_staff_users_cannot_open_the_model_admin(client) -> None:
    get_user_model().objects.create_user("bob", password="pw-bob-1234567")
    client.login(username="bob", password="pw-bob-1234567")
    assert client.get(ADD_URL).status_code == 302  # to the admin login


def test_an_invalid_configuration_is_refused_with_the_reason_shown(staff_client, tmp_path):
    response = staff_client.post(ADD_URL, FORM | {"source": str(tmp_path / "nope")})
    assert response.status_code == 200
    assert "no such file or directory" in response.content.decode()
    assert not ModelConfig.objects.exists()


def test_the_source_field_offers_the_catalogue_and_still_takes_free_text(
    staff_client, settings, tmp_path
) -> None:
    settings.CACHET_MODEL_CACHE = tmp_path  # nothing fetched here
    page = staff_client.get(ADD_URL).content.decode()
    assert 'list="id_source-catalogue"' in page
    datalist = page[page.index('<datalist id="id_source-catalogue">') :]
    datalist = datalist[: datalist.index("</datalist>")]
    assert datalist.count("<option ") == len(catalogue.CATALOGUE)
    assert (
        '<option value="qwen2.5-coder-1.5b-instruct">Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, '
        "1,117 MB (instruct, default, fetched on activation)</option>"
    ) in datalist
    assert '<option value="gemma-3-270m">Gemma 3 270M (base), GGUF Q4_K_M, 253 MB (base, ' in (
        datalist
    )
    assert "SmolLM2-135M-Instruct, GGUF Q4_1, 98 MB (instruct)</option>" in datalist


def test_a_catalogue_name_is_a_valid_source_even_before_it_is_fetched(
    staff_client, settings, tmp_path
) -> None:
    settings.CACHET_MODEL_CACHE = tmp_path
    response = staff_client.post(ADD_URL, FORM | {"source": "qwen2.5-coder-0.5b-instruct"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert ModelConfig.objects.get(name="smaller").source == "qwen2.5-coder-0.5b-instruct"
    assert list(tmp_path.iterdir()) == []  # fetched on activation, not on saving


def test_a_misspelt_catalogue_name_is_refused_with_the_catalogue_listed(staff_client) -> None:
    response = staff_client.post(ADD_URL, FORM | {"source": "qwen2.5-coder-1.5b"})
    assert response.status_code == 200
    assert "no model named &#x27;qwen2.5-coder-1.5b&#x27; in the catalogue" in (
        response.content.decode()
    )
    assert not ModelConfig.objects.exists()


@pytest.mark.real_weights
def test_activating_a_configuration_reloads_the_engine(staff_client, chat_model_dir) -> None:
    response = staff_client.post(ADD_URL, FORM)
    assert response.status_code == 302, response.content.decode()[:2000]
    config = ModelConfig.objects.get(name="smaller")
    response = staff_client.post(
        "/admin/inference/modelconfig/",
        {"action": "activate_selected", "_selected_action": [config.pk]},
        follow=True,
    )
    assert "Loading &#x27;smaller&#x27;" in response.content.decode()
    config.refresh_from_db()
    assert config.is_active
    engine = _wait_for_config("smaller")
    assert engine.config.max_num_seqs == 8
    # The speed options are loaded too: int8 weights, speculative decoding.
    assert (engine.config.quantization, engine.config.num_speculative_tokens) == ("int8", 2)
    assert type(engine.runner.model.layers[0].mlp.down_proj).__name__ == "Int8Linear"


def _wait_for_config(name: str, timeout_s: float = 120.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = runtime.engine_status()
        if status["status"] == "ready" and status["config"] == name:
            return runtime.get_engine()
        time.sleep(0.2)
    raise AssertionError(f"engine never served {name!r}: {runtime.engine_status()}")
