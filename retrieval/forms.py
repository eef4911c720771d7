"""Admin forms: multi-file upload into a collection, and the search preview."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from retrieval.extract import SUPPORTED_SUFFIXES
from retrieval.models import Collection

if TYPE_CHECKING:
    from retrieval.explain import Explanation


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
                    _("%(name)s is larger than the %(limit)s MB limit.")
                    % {"name": upload.name, "limit": settings.CACHET_MAX_UPLOAD_MB}
                )
            elif Path(upload.name).suffix.lower() not in SUPPORTED_SUFFIXES:
                errors.append(
                    _("%(name)s: unsupported type; use %(types)s.")
                    % {"name": upload.name, "types": ", ".join(SUPPORTED_SUFFIXES)}
                )
        if errors:
            raise forms.ValidationError(errors)
        return cleaned


class UploadForm(forms.Form):
    collection = forms.ModelChoiceField(
        queryset=Collection.objects.all(), label=gettext_lazy("Collection")
    )
    # NOTE: Django's form metaclass moves declared fields into `base_fields`, so this field never
    # shadows `BaseForm.files` (the request's files), as the type checker reads it.
    files = MultipleFileField(label=gettext_lazy("Files"))  # type: ignore[assignment]


class SearchPreviewForm(forms.Form):
    query = forms.CharField(max_length=1000, label=gettext_lazy("Query"))
    collections = forms.ModelMultipleChoiceField(
        queryset=Collection.objects.all(),
        required=False,
        label=gettext_lazy("Collections"),
        help_text=gettext_lazy("None selected: all."),
    )
    top_k = forms.IntegerField(
        min_value=1, max_value=50, initial=5, label=gettext_lazy("Results (top k)")
    )

    def explain(self, user: Any, mode: str = "hybrid+rerank") -> Explanation:
        """The search these fields ask for (call after `is_valid()`), with its whole pool."""
        from retrieval.explain import explain

        return explain(
            self.cleaned_data["query"],
            self.cleaned_data["collections"] or None,
            self.cleaned_data["top_k"],
            user=user,
            mode=mode,
        )
