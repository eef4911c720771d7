"""The evaluation page (staff): the golden set's size, "Run evaluation", every run's figures as a
table and a chart over time, and each run's questions one by one.

Staff only: another logged-in user gets 403 (the page and its JSON alike), an anonymous one the
log-in page (the page) or 401 (the JSON). Runs are evals.tasks', scored by evals.evaluation.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import translation
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from chat.views import error_response
from evals.evaluation import METRICS
from evals.models import EvalResult, EvalRun, GoldenQuestion
from evals.tasks import CannotStartRun, expire_stale_runs, start_run
from frontend.views import catalog_url

MAX_RUNS_LISTED = 200


def _refusal(request: HttpRequest) -> JsonResponse | None:
    if not request.user.is_authenticated or not request.user.is_active:
        return error_response(401, "unauthenticated", _("log in first"))
    if not request.user.is_staff:
        return error_response(403, "forbidden", _("the evaluation page is for staff"))
    return None


@require_GET
@login_required
def evaluation(request: HttpRequest) -> HttpResponse:
    if not request.user.is_staff:
        raise PermissionDenied("the evaluation page is for staff")
    context = {
        "catalog_url": catalog_url(translation.get_language()),
        "config": {
            "data_url": reverse("frontend:evaluation-data"),
            "start_url": reverse("frontend:evaluation-start"),
            "run_url": reverse("frontend:evaluation-run", args=[0]),
        },
        "golden_url": reverse("admin:evals_goldenquestion_changelist"),
        "feedback_url": reverse("admin:chat_answerfeedback_changelist"),
    }
    return render(request, "frontend/evaluation.html", context)


def run_json(run: EvalRun) -> dict:
    return {
        "id": run.pk,
        "status": run.status,
        "status_label": run.get_status_display(),
        "error": _(run.error) if run.error else "",
        "created_at": run.created_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "seconds": (run.finished_at - run.started_at).total_seconds()
        if run.finished_at and run.started_at
        else None,
        "model": run.model,
        "embedding_model": run.embedding_model,
        "num_questions": run.num_questions,
        "metrics": {metric: getattr(run, metric) for metric in METRICS},
    }


def result_json(result: EvalResult) -> dict:
    return {
        "question": result.question,
        "expected_answer": result.expected_answer,
        "answer": result.answer,
        "retrieval_level": result.retrieval_level,
        "retrieved": result.retrieved,
        "error": result.error,
        "metrics": {metric: getattr(result, metric) for metric in METRICS},
    }


@require_GET
@never_cache
def evaluation_data(request: HttpRequest) -> JsonResponse:
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    expire_stale_runs(in_server=True)
    golden = GoldenQuestion.objects.filter(is_active=True)
    runs = EvalRun.objects.all()[:MAX_RUNS_LISTED]
    return JsonResponse(
        {
            "golden": {
                "active": golden.count(),
                "without_answer": golden.filter(expected_answer="").count(),
            },
            "runs": [run_json(run) for run in runs],
        }
    )


@require_POST
def evaluation_start(request: HttpRequest) -> JsonResponse:
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    try:
        run = start_run(request.user)
    except CannotStartRun as error:
        status = 409 if error.code == "run_in_progress" else 400
        return error_response(status, error.code, _(str(error)))
    return JsonResponse({"run": run_json(run)}, status=202)


@require_GET
@never_cache
def evaluation_run(request: HttpRequest, run_id: int) -> JsonResponse:
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    run = EvalRun.objects.filter(pk=run_id).first()
    if run is None:
        return error_response(404, "not_found", _("run %(id)s not found") % {"id": run_id})
    results = [result_json(result) for result in run.results.all()]
    return JsonResponse({"run": run_json(run), "results": results})
