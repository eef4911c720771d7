"""The admin's model source input: free text, with the model catalogue offered as suggestions."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.forms.renderers import BaseRenderer
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from inference import catalogue
from inference.catalogue import CatalogueModel


def catalogue_label(model: CatalogueModel) -> str:
    """How the admin describes an entry: title, size, kind, and whether it is ready to serve."""
    notes = [model.kind]
    if model.name == catalogue.DEFAULT_CHAT_MODEL:
        notes.append("default")
    if catalogue.fetched_path(model.name, settings.CACHET_MODEL_CACHE) is None:
        notes.append("fetched on activation")
    return f"{model.title}, {model.format}, {model.size_mb:,.0f} MB ({', '.join(notes)})"


class CatalogueSourceInput(forms.TextInput):
    """A text input tied to a <datalist> of the catalogue's names.

    NOTE: a datalist, not a select: hub ids, directories and .gguf paths stay valid sources.
    """

    def render(
        self,
        name: str,
        value: Any,
        attrs: dict[str, Any] | None = None,
        renderer: BaseRenderer | None = None,
    ) -> SafeString:
        list_id = f"{(attrs or {}).get('id') or name}-catalogue"
        field = super().render(name, value, {**(attrs or {}), "list": list_id}, renderer)
        options = format_html_join(
            "",
            '<option value="{}">{}</option>',
            ((model.name, catalogue_label(model)) for model in catalogue.CATALOGUE.values()),
        )
        return format_html('{}<datalist id="{}">{}</datalist>', field, list_id, options)
