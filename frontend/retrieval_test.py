"""The retrieval test page (staff): a query against chosen collections, and every candidate of its
pool with its BM25, dense and fused scores, its rank before and after reranking, and where and why
top-K cut the pool. It runs `retrieval.explain.explain`, the pipeline chat turns use."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext_lazy as _

from frontend.documents import passage_url
from retrieval.forms import SearchPreviewForm
from retrieval.models import Collection

# What chat uses first: a link without `mode` (the admin's search preview) means it.
MODE_LABELS = {
    "hybrid+rerank": _("Hybrid, reranked (what chat uses)"),
    "hybrid": _("Hybrid (reciprocal rank fusion)"),
    "bm25": _("BM25 only"),
    "dense": _("Dense only"),
}


class RetrievalTestForm(SearchPreviewForm):
    mode = forms.ChoiceField(
        choices=list(MODE_LABELS.items()),
        initial="hybrid+rerank",
        required=False,  # a link from the admin's search preview names none
        label=_("Ranking"),
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        collections = cast(forms.ModelMultipleChoiceField, self.fields["collections"])
        collections.queryset = Collection.readable_by(user)
        self.fields["top_k"].initial = settings.CACHET_SEARCH_TOP_K


@login_required
def retrieval_test(request: HttpRequest) -> HttpResponse:
    if not request.user.is_staff:
        raise PermissionDenied
    form = RetrievalTestForm(request.GET or None, user=request.user)
    explanation = None
    if request.GET and form.is_valid():
        explanation = form.explain(request.user, form.cleaned_data["mode"] or "hybrid+rerank")
    rows = []
    if explanation is not None:
        rows = [
            {
                "entry": entry,
                "is_kept": entry.final_rank <= explanation.top_k,
                "url": passage_url(entry.hit.document_id, entry.hit.chunk_id),
            }
            for entry in explanation.pool
        ]
    context = {
        "form": form,
        "explanation": explanation,
        "mode_label": MODE_LABELS[explanation.mode] if explanation else "",
        "rows": rows,
    }
    return render(request, "frontend/retrieval_test.html", context)
