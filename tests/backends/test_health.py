"""backends.health: the active check against a real remote Cachet, and the recorded state."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from backends.health import HealthResult, check_and_record, check_health, record_health
from backends.models import InferenceBackend
from tests.remote_cachet import backend_for, unreachable_url


def test_a_serving_endpoint_is_up_and_names_the_model(remote_cachet) -> None:
    result = check_health(backend_for(remote_cachet))
    assert result.is_up and remote_cachet.model in result.detail


def test_an_endpoint_without_the_model_is_down_and_lists_what_it_serves(remote_cachet) -> None:
    result = check_health(backend_for(remote_cachet, model="big-model"))
    assert result.health == "down"
    assert "does not serve 'big-model'" in result.detail and remote_cachet.model in result.detail


def test_an_unreachable_endpoint_or_a_refused_key_is_down(remote_cachet) -> None:
    unreachable = check_health(backend_for(remote_cachet, base_url=unreachable_url()))
    assert unreachable.health == "down" and "unreachable" in unreachable.detail
    refused = check_health(backend_for(remote_cachet, api_key="ck-wrong"))
    assert refused.health == "down" and "HTTP 401" in refused.detail


@pytest.mark.django_db
def test_the_result_is_saved_on_the_row_and_logged_when_the_state_changes(
    remote_cachet, caplog
) -> None:
    backend = backend_for(remote_cachet)
    backend.save()
    assert check_and_record(backend).is_up
    record_health(backend, HealthResult("down", "refused a request"))
    row = InferenceBackend.objects.get(pk=backend.pk)
    assert (row.health, row.health_detail) == ("down", "refused a request")
    assert row.health_checked_at is not None
    assert "inference backend upstream is down: refused a request" in caplog.text


@pytest.mark.django_db
def test_the_command_checks_every_enabled_backend_and_fails_when_one_is_down(
    remote_cachet, capsys
) -> None:
    backend_for(remote_cachet, name="good").save()
    backend_for(remote_cachet, name="gone", base_url=unreachable_url()).save()
    backend_for(remote_cachet, name="off", is_enabled=False, base_url=unreachable_url()).save()
    with pytest.raises(CommandError, match="1 backend"):
        call_command("check_backends")
    output = capsys.readouterr().out
    assert "good\tup" in output and "gone\tdown" in output and "off" not in output
    assert InferenceBackend.objects.get(name="off").health == "unknown"
