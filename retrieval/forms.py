"""Admin forms: multi-file upload into a collection, and the search preview."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django import forms
from django.conf import settings
from django.core.files.uploadedfile import UploadedFile

from retrieval.extract import SUPPORTED_SUFFIXES
from retrieval.models import Collection


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault(
            "widget", MultipleFileInput(attrs={"accept": ",".join(SUPPORTED_SUFFIXES)})
        )
        super().__init__(*args, **kwargs)

    def clean(self, data: Any, initial: Any = None) -> list[UploadedFile[bytes]]:
        files = data if isinstance(data, list | tuple) else [data]
        cleaned = [super(MultipleFileField, self).clean(item, initial) for item in files]
        limit = settings.CACHET_MAX_UPLOAD_MB * 1024 * 1024
        errors = []
        for upload in cleaned:
            if upload.size > limit:
                errors.append(
                    f"{upload.name} is larger than the {settings.CACHET_MAX_UPLOAD_MB} MB limit."
                )
            elif Path(upload.name).suffix.lower() not in SUPPORTED_SUFFIXES:
                errors.append(
                    f"{upload.name}: unsupported type; use {', '.join(SUPPORTED_SUFFIXES)}."
                )
        if errors:
            raise forms.ValidationError(errors)
        return cleaned


class UploadForm(forms.Form):
    collection = forms.ModelChoiceField(queryset=Collection.objects.all())
    # NOTE: Django's form metaclass moves declared fields into `base_fields`, so this field never
    # shadows `BaseForm.files` (the request's files), as the type checker reads it.
    files = MultipleFileField()  # type: ignore[assignment]


class SearchPreviewForm(forms.Form):
    query = forms.CharField(max_length=1000)
    collections = forms.ModelMultipleChoiceField(
        queryset=Collection.objects.all(), required=False, help_text="None selected: all."
    )
    top_k = forms.IntegerField(min_value=1, max_value=50, initial=5)
