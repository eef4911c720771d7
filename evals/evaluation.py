"""One evaluation run over the golden set: the served search and the served model, scored.

Retrieval: each question is searched as a chat turn searches (`retrieval.search.search`, the
served ranking, the question's collections) and its top 10 scored against the expected chunks
(or, when none of them is left, the expected documents) with the metric code of `manage.py
eval_retrieval` (`retrieval.evaluation.score_ranking`). Answers: each question goes through the
chat's own answer loop (`chat.answer.answer_turn`: retrieval, routing, the chat's prompt layout,
the served model), greedy, and is scored against the expected answer with the answer-quality
benchmark's metrics (`evals.answer_metrics`: SQuAD token F1 and "contained"; character F1 for
Chinese). A question without an expected answer scores retrieval only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import statistics
import time
from collections.abc import Iterable, Sequence

from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.utils import timezone
from django.utils.translation import gettext_noop

from chat.answer import Answer, TurnInput, answer_turn
from chat.errors import ChatError
from chat.models import AssistantProfile
from chat.turn import sampling_params_for
from evals.answer_metrics import is_chinese, score_answer, score_chinese_answer
from evals.models import EvalResult, EvalRun, GoldenQuestion
from inference import runtime
from inference.engine import SamplingParams
from inference.models import ModelConfig
from retrieval.evaluation import score_ranking
from retrieval.models import Collection
from retrieval.search import get_retriever, search

logger = logging.getLogger(__name__)

RETRIEVAL_DEPTH = 10  # nDCG@10 and MRR@10 need the top 10
MAX_CONCURRENT_ANSWERS = 4  # answered together: the engine batches them
ENGINE_WAIT_S = 600
# NOTE: stored untranslated and translated when shown (the run has no request language).
EMPTY_GOLDEN_SET = gettext_noop(
    "The golden set is empty: add rated answers to it in the admin (Answer feedback, "
    "'Add to golden set') or write golden questions there."
)
NO_USER = gettext_noop("The user who started the run no longer exists.")
ALL_ANSWERS_FAILED = gettext_noop("The model failed on every question: %(error)s")
METRICS = ("recall1", "recall5", "ndcg10", "mrr10", "answer_f1", "answer_contained")


class EvaluationError(Exception):
    """A run that cannot go on; its message is what the evaluation page shows."""


def run_evaluation(run_id: int) -> EvalRun:
    """Evaluate the active golden set into run `run_id` (queued); a run already started or
    finished is left as it is (a task delivered twice). Never raises for a failed run: it ends
    `failed` with the reason."""
    claimed = EvalRun.objects.filter(pk=run_id, status=EvalRun.Status.QUEUED).update(
        status=EvalRun.Status.RUNNING, started_at=timezone.now()
    )
    run = EvalRun.objects.select_related("started_by").get(pk=run_id)
    if not claimed:
        return run
    try:
        _evaluate(run)
    except Exception as error:
        # NOTE: whatever went wrong, the run ends with a reason instead of staying "running".
        if not isinstance(error, EvaluationError):
            logger.exception("evaluation run %s failed", run_id)
        run.status, run.error = EvalRun.Status.FAILED, str(error) or type(error).__name__
        run.finished_at = timezone.now()
        run.save(update_fields=["status", "error", "finished_at"])
    return run


def _evaluate(run: EvalRun) -> None:
    questions = list(
        GoldenQuestion.objects.filter(is_active=True)
        .order_by("pk")
        .prefetch_related("expected_chunks", "expected_documents", "collections")
    )
    if not questions:
        raise EvaluationError(EMPTY_GOLDEN_SET)
    user = run.started_by
    if user is None:
        raise EvaluationError(NO_USER)
    run.num_questions = len(questions)
    run.embedding_model = get_retriever().embedder.model_id
    run.save(update_fields=["num_questions", "embedding_model"])
    wait_for_engine()
    profile = AssistantProfile.default()
    params = dataclasses.replace(
        sampling_params_for(profile, ModelConfig.active() or ModelConfig(name="defaults"), seed=0),
        temperature=0.0,  # greedy: a run measures the model, not the dice
    )
    scopes = [_collection_ids(question, user) for question in questions]
    results = [
        _retrieval_result(run, question, scope, user)
        for question, scope in zip(questions, scopes, strict=True)
    ]
    answers = async_to_sync(_answer_all)(questions, scopes, user, profile, params, run.pk)
    for result, answer in zip(results, answers, strict=True):
        _score_answer(result, answer)
    EvalResult.objects.bulk_create(results)  # kept on failure too: the drill-down shows why
    errors = [result.error for result in results if result.error]
    if len(errors) == len(results):
        raise EvaluationError(ALL_ANSWERS_FAILED % {"error": errors[0]})
    for metric in METRICS:
        setattr(run, metric, _mean(getattr(result, metric) for result in results))
    models = [a.model_name for a in answers if isinstance(a, Answer) and a.model_name]
    run.model = ", ".join(dict.fromkeys(models))
    run.status, run.finished_at = EvalRun.Status.DONE, timezone.now()
    run.save()


def wait_for_engine(timeout_s: float = ENGINE_WAIT_S) -> None:
    """Until the process's engine is ready; loads it where none was ever started (a Celery
    worker). An engine whose load failed is not retried here: the run fails with its error."""
    if runtime.engine_status()["status"] == "not_started":
        runtime.start_engine()
    deadline = time.monotonic() + timeout_s
    while True:
        status = runtime.engine_status()
        if status["status"] == "ready":
            return
        if status["status"] == "error":
            raise EvaluationError(f"The model could not be loaded: {status['error']}")
        if time.monotonic() > deadline:
            raise EvaluationError(f"The model was not ready after {timeout_s:.0f} s.")
        time.sleep(0.5)


def _collection_ids(question: GoldenQuestion, user: User) -> list[int]:
    chosen = [collection.pk for collection in question.collections.all()]
    readable = Collection.readable_by(user)
    if chosen:
        readable = readable.filter(pk__in=chosen)
    return list(readable.values_list("pk", flat=True))


def _retrieval_result(
    run: EvalRun, question: GoldenQuestion, collection_ids: list[int], user: User
) -> EvalResult:
    chunk_ids = {str(chunk.pk) for chunk in question.expected_chunks.all()}
    document_ids = {str(document.pk) for document in question.expected_documents.all()}
    level, relevant = ("chunk", chunk_ids) if chunk_ids else ("document", document_ids)
    if not relevant:
        level = ""
    hits = search(question.question, collection_ids, RETRIEVAL_DEPTH, user=user)
    ranked: list[str] = []
    retrieved = []
    for rank, hit in enumerate(hits, start=1):
        key = str(hit.chunk_id if level == "chunk" else hit.document_id)
        if key not in ranked:
            ranked.append(key)
        retrieved.append(
            {
                "rank": rank,
                "chunk_id": hit.chunk_id,
                "document_id": hit.document_id,
                "title": hit.document_title,
                "is_expected": key in relevant,
            }
        )
    scores = score_ranking(ranked, relevant) if relevant else {}
    return EvalResult(
        run=run,
        golden=question,
        question=question.question,
        expected_answer=question.expected_answer,
        retrieval_level=level,
        expected=sorted(int(key) for key in relevant),
        retrieved=retrieved,
        recall1=scores.get("recall1"),
        recall5=scores.get("recall5"),
        ndcg10=scores.get("ndcg10"),
        mrr10=scores.get("mrr10"),
    )


async def _answer_all(
    questions: Sequence[GoldenQuestion],
    scopes: Sequence[list[int]],
    user: User,
    profile: AssistantProfile,
    params: SamplingParams,
    run_id: int,
) -> list[Answer | ChatError]:
    """Every question through the chat's answer loop, a few at a time (batched by the engine)."""
    gate = asyncio.Semaphore(MAX_CONCURRENT_ANSWERS)

    async def answer_one(question: GoldenQuestion, scope: list[int]) -> Answer | ChatError:
        turn = TurnInput(
            user=user,
            question=question.question,
            system_prompt=profile.system_prompt,
            params=dataclasses.replace(params),
            collection_ids=scope,
            search_top_k=profile.search_top_k,
            request_id_prefix=f"eval-{run_id}",
            profile_routing=profile.routing,
        )
        answer = Answer()
        async with gate:
            try:
                async for _event in answer_turn(turn, answer):
                    pass
            except ChatError as error:
                return error
        return answer

    return await asyncio.gather(*map(answer_one, questions, scopes))


def _score_answer(result: EvalResult, answer: Answer | ChatError) -> None:
    if isinstance(answer, ChatError):
        result.error = f"{answer.code}: {answer}"
        return
    result.answer = answer.text.strip()
    if answer.finish_reason == "error":
        result.error = "the model failed while answering"
        return
    if result.expected_answer.strip():
        result.answer_f1, result.answer_contained = answer_scores(
            result.answer, result.expected_answer
        )


def answer_scores(prediction: str, expected: str) -> tuple[float, float]:
    """F1 and "contained" of an answer against the expected one: SQuAD's token scores, or for a
    Chinese reference character F1, "contained" meaning every character of it is in the answer."""
    if is_chinese(expected):
        chinese = score_chinese_answer(prediction, [expected])
        return chinese.f1, float(chinese.recall >= 1.0)
    english = score_answer(prediction, [expected])
    return english.f1, english.contained


def _mean(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return round(statistics.fmean(present), 4) if present else None
