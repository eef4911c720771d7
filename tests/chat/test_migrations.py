"""chat/migrations/0003: profiles on the old built-in system prompt get the new one, and back."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from chat.models import DEFAULT_SYSTEM_PROMPT

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("chat", "0002_routing_and_answer_backend")]
AFTER = [("chat", "0003_default_prompt_answer_language")]
OLD_DEFAULT = (
    "You are a helpful assistant. Answer the user's question using the documents they provide. "
    "Cite a document by its number in brackets, like [1]."
)
EDITED = OLD_DEFAULT + " Be brief."


def migrate(target) -> object:
    """Migrate the test database to `target`; the historical AssistantProfile model there."""
    executor = MigrationExecutor(connection)
    executor.migrate(target)
    executor.loader.build_graph()
    return executor.loader.project_state(target).apps.get_model("chat", "AssistantProfile")


def prompts(profiles) -> dict[str, str]:
    return dict(profiles.objects.values_list("name", "system_prompt"))


def test_profiles_on_the_old_default_text_move_to_the_new_one_and_back():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("chat")
    try:
        profiles = migrate(BEFORE)
        profiles.objects.create(name="Assistant", system_prompt=OLD_DEFAULT, is_default=True)
        profiles.objects.create(name="Edited", system_prompt=EDITED)

        profiles = migrate(AFTER)
        assert prompts(profiles) == {"Assistant": DEFAULT_SYSTEM_PROMPT, "Edited": EDITED}
        assert profiles._meta.get_field("system_prompt").default == DEFAULT_SYSTEM_PROMPT
        # A profile made after the change, on the new default, goes back to the old text too.
        profiles.objects.create(name="New", system_prompt=DEFAULT_SYSTEM_PROMPT)

        profiles = migrate(BEFORE)
        assert prompts(profiles) == {
            "Assistant": OLD_DEFAULT, "Edited": EDITED, "New": OLD_DEFAULT,
        }  # fmt: skip
    finally:
        migrate(latest)
