# The built-in system prompt asks for answers in the language of the question (issue 20, part 5).
# Profiles still on the old built-in text get the new one; edited prompts are left alone.
# Reversible: going back puts the profiles on the new text back on the old one.

from django.db import migrations, models

# NOTE: both texts are spelled out here, not imported from chat.models, so this migration keeps
# meaning the same thing when the default changes again.
OLD_DEFAULT = (
    "You are a helpful assistant. Answer the user's question using the documents they provide. "
    "Cite a document by its number in brackets, like [1]."
)
NEW_DEFAULT = (
    "You are a helpful assistant. Answer the user's question using the documents they provide. "
    "Cite a document by its number in brackets, like [1]. Answer in the language of the "
    "question, not of the documents."
)


def _replace_prompt(old: str, new: str):
    def replace(apps, schema_editor) -> None:
        profiles = apps.get_model("chat", "AssistantProfile")
        profiles.objects.using(schema_editor.connection.alias).filter(system_prompt=old).update(
            system_prompt=new
        )

    return replace


class Migration(migrations.Migration):

    dependencies = [
        ("chat", "0002_routing_and_answer_backend"),
    ]

    operations = [
        migrations.AlterField(
            model_name="assistantprofile",
            name="system_prompt",
            field=models.TextField(default=NEW_DEFAULT),
        ),
        migrations.RunPython(
            _replace_prompt(OLD_DEFAULT, NEW_DEFAULT),
            _replace_prompt(NEW_DEFAULT, OLD_DEFAULT),
        ),
    ]
