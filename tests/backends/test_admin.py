"""The inference-backend admin: the API key is write-only, kept when left empty, never listed."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from backends.models import InferenceBackend

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/backends/inferencebackend/"
ADD_URL = f"{CHANGELIST}add/"
SECRET = "sk-upstream-secret-value-1234567890"
FORM = {
    "name": "gpu-1",
    "base_url": "http://gpu-1.internal:8000/v1",
    "api_key": SECRET,
    "model": "Qwen2.5-72B-Instruct",
    "weight": "2",
    "is_enabled": "on",
    "takes_complex_requests": "on",
}


@pytest.fixture
def staff_client(client):
    get_user_model().objects.create_superuser("root", password="pw-root-123456")
    client.login(username="root", password="pw-root-123456")
    return client


def test_a_backend_is_added_with_its_key_which_no_page_shows_back(staff_client) -> None:
    response = staff_client.post(ADD_URL, FORM, follow=True)
    assert response.status_code == 200
    backend = InferenceBackend.objects.get(name="gpu-1")
    assert backend.api_key == SECRET and backend.weight == 2 and backend.health == "unknown"

    listing = staff_client.get(CHANGELIST).content.decode()
    assert "gpu-1" in listing and "Qwen2.5-72B-Instruct" in listing
    assert SECRET not in listing
    change = staff_client.get(f"{CHANGELIST}{backend.pk}/change/").content.decode()
    assert SECRET not in change
    assert SECRET not in repr(backend) and SECRET not in str(backend)


def test_an_empty_key_on_edit_keeps_the_key_and_clearing_removes_it(staff_client) -> None:
    staff_client.post(ADD_URL, FORM)
    backend = InferenceBackend.objects.get(name="gpu-1")
    change_url = f"{CHANGELIST}{backend.pk}/change/"

    staff_client.post(change_url, FORM | {"api_key": "", "weight": "5"})
    backend.refresh_from_db()
    assert backend.api_key == SECRET and backend.weight == 5

    staff_client.post(change_url, FORM | {"api_key": "", "clear_api_key": "on"})
    backend.refresh_from_db()
    assert backend.api_key == ""


def test_a_zero_weight_and_a_key_with_spaces_are_refused(staff_client) -> None:
    response = staff_client.post(ADD_URL, FORM | {"weight": "0", "api_key": "two words"})
    errors = response.context["adminform"].form.errors
    assert "weight" in errors and "one word" in str(errors["api_key"])
    assert not InferenceBackend.objects.exists()


def test_the_health_action_records_what_the_check_saw(staff_client) -> None:
    staff_client.post(ADD_URL, FORM | {"base_url": "http://127.0.0.1:1/v1"})
    backend = InferenceBackend.objects.get(name="gpu-1")
    response = staff_client.post(
        CHANGELIST,
        {"action": "check_health_of_selected", "_selected_action": [backend.pk]},
        follow=True,
    )
    shown = [str(message) for message in response.context["messages"]]
    assert shown[-1].startswith("gpu-1: down (unreachable: ConnectError"), shown
    backend.refresh_from_db()
    assert backend.health == "down" and backend.health_checked_at is not None
