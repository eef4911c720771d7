"""What the reliability suites share: the server's start, engine state, API client, checks, CLI.

A suite starts a `LiveServer`, sets it up with `harness.site.prepare_site` (run in the server's
own Django shell: an active model configuration, users with sessions, an assistant profile, an API
key), drives it (`harness.chat_client` for `/ws/chat/`, the official `openai` client for `/v1`,
through `api_chat` here), and reads the engine's state from `/metrics`. Its report holds a list of
checks (`check()`); the process exits with status 1 when any of them failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import urllib.error
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from harness import SITE_TIMEOUT_S, LiveServer, run_cli

logger = logging.getLogger(__name__)

MAX_DETAILS = 10  # mismatches, errors... listed in a report
SYSTEM_PROMPT = "You are a helpful assistant. Answer in one or two short sentences."
QUESTIONS = (
    "What is the capital of France?",
    "Why is the sky blue?",
    "Name three animals that live in the sea.",
    "How many legs does a spider have?",
    "What does a bakery sell?",
    "Give me a tip for a rainy day.",
    "What is the boiling point of water?",
    "Which planet is closest to the sun?",
    "What is a good name for a cat?",
    "How do plants make food?",
    "What colour do you get by mixing blue and yellow?",
    "Suggest a short poem title about autumn.",
    "What is the opposite of cold?",
    "Why do we sleep?",
    "What is two plus three?",
    "Tell me one fact about the moon.",
)


def question(index: int, iteration: int) -> str:
    """A short question, different for consecutive iterations and neighbouring clients."""
    text = QUESTIONS[(index * 7 + iteration) % len(QUESTIONS)]
    return f"(client {index + 1}, question {iteration + 1}) {text}"


def start_server(server: LiveServer, spec: dict, *, startup_timeout_s: float | None = None) -> dict:
    """Set up the site `spec` asks for on the server's database, then start it; the site.

    `spec`: `model_config` (ModelConfig fields), `users` (how many, each with a session) and
    `profile` (AssistantProfile fields; the system prompt defaults to `SYSTEM_PROMPT`), as
    `harness.site.prepare_site` takes them; every suite gets an API key.
    """
    profile = {"system_prompt": SYSTEM_PROMPT, **(spec.get("profile") or {})}
    spec = {**spec, "label": "reliability", "user": {"first_name": "Sam"}, "profile": profile}
    spec["api_key"] = True
    site = server.call("harness.site:prepare_site", spec, timeout=SITE_TIMEOUT_S)
    began = time.perf_counter()
    server.start(timeout_s=startup_timeout_s)
    site["startup_s"] = round(time.perf_counter() - began, 2)
    logger.info(
        "server ready in %.1fs on %s: %s, KV %d tokens",
        site["startup_s"],
        server.url,
        site["model_config"],
        site["kv_tokens"],
    )
    return site


# --- The server's state ---


@dataclass(slots=True)
class EngineState:
    """The engine's gauges and counters from `/metrics` at one moment."""

    running: int
    waiting: int
    kv_usage: float
    preemptions: int
    finished: dict[str, int]  # finished requests by finish reason

    @property
    def is_idle(self) -> bool:
        return self.running == 0 and self.waiting == 0 and self.kv_usage == 0.0

    def as_json(self) -> dict:
        return asdict(self)


def engine_state(server: LiveServer) -> EngineState | None:
    """The engine's state from `/metrics`; None if it cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = server.metrics_text()
    except (urllib.error.URLError, OSError) as error:
        logger.warning("could not read /metrics: %s", error)
        return None
    values: dict[str, float] = {}
    finished: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "cachet_engine_requests_total":
                finished[sample.labels["finish_reason"]] = int(sample.value)
            else:
                values[sample.name] = sample.value
    return EngineState(
        running=int(values.get("cachet_engine_requests_running", -1)),
        waiting=int(values.get("cachet_engine_requests_waiting", -1)),
        kv_usage=float(values.get("cachet_engine_kv_cache_usage_ratio", -1.0)),
        preemptions=int(values.get("cachet_engine_preemptions_total", 0)),
        finished=finished,
    )


def wait_for_idle(
    server: LiveServer, timeout_s: float, poll_s: float = 0.25
) -> tuple[EngineState | None, float]:
    """Poll `/metrics` until no request runs or waits and no KV block is held, or `timeout_s`.

    Returns the last state read and the seconds waited.
    """
    began = time.monotonic()
    state = engine_state(server)
    while (state is None or not state.is_idle) and time.monotonic() - began < timeout_s:
        time.sleep(poll_s)
        state = engine_state(server)
    return state, round(time.monotonic() - began, 2)


def rss_mb(pid: int | None) -> float | None:
    """Resident memory of a process in MB (None if it is gone)."""
    import psutil

    if pid is None:
        return None
    try:
        return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
    except psutil.Error:
        return None


def healthz(server: LiveServer) -> str:
    """`/healthz`'s status ("ok", "loading", "error"), or why it could not be read."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{server.url}/healthz", timeout=10) as response:
            return json.load(response).get("status", "?")
    except urllib.error.HTTPError as error:
        try:
            return json.loads(error.read() or b"{}").get("status", f"HTTP {error.code}")
        except ValueError:
            return f"HTTP {error.code}"
    except (OSError, ValueError) as error:
        return f"unreachable: {error}"


# --- The API client ---


@dataclass(slots=True)
class ApiReply:
    """One chat completion, streamed or not."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0
    error: dict | None = None


async def api_chat(client, model: str, messages: list[dict], *, stream: bool, **params) -> ApiReply:
    """A chat completion with the `openai` client; errors end up in the reply, not raised.

    A stream must end with a finish reason and the usage chunk (`[DONE]` ends the iterator).
    """
    import openai

    reply = ApiReply()
    extra = {"extra_body": {"ignore_eos": True}} if params.pop("ignore_eos", False) else {}
    try:
        if not stream:
            response = await client.chat.completions.create(
                model=model, messages=messages, **params, **extra
            )
            choice = response.choices[0]
            reply.text = choice.message.content or ""
            reply.finish_reason = choice.finish_reason
            reply.prompt_tokens = response.usage.prompt_tokens
            reply.completion_tokens = response.usage.completion_tokens
            return reply
        chunks = await client.chat.completions.create(
            model=model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            **params,
            **extra,
        )
        parts = []
        async for chunk in chunks:
            reply.chunks += 1
            if chunk.choices:
                choice = chunk.choices[0]
                parts.append(choice.delta.content or "")
                reply.finish_reason = choice.finish_reason or reply.finish_reason
            if chunk.usage is not None:
                reply.prompt_tokens = chunk.usage.prompt_tokens
                reply.completion_tokens = chunk.usage.completion_tokens
        reply.text = "".join(parts)
    except openai.APIError as error:
        status = getattr(error, "status_code", None)
        reply.error = {"type": type(error).__name__, "status": status, "message": str(error)[:300]}
        return reply
    if reply.finish_reason is None or reply.completion_tokens is None:
        reply.error = {"type": "Truncated", "message": "the stream ended without finish or usage"}
    return reply


def api_client(server: LiveServer, api_key: str, timeout_s: float):
    from openai import AsyncOpenAI

    return AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key=api_key, max_retries=0, timeout=timeout_s
    )


# --- Checks and the report ---


def check(name: str, ok: bool, **detail) -> dict:
    """One check of a report: its name, whether it passed, and the numbers behind it."""
    if not ok:
        logger.warning("check failed: %s %s", name, json.dumps(detail, default=str)[:500])
    return {"name": name, "ok": bool(ok), **detail}


def num_failed(report: dict) -> int:
    return sum(1 for item in report["checks"] if not item["ok"])


def format_checks(report: dict, summary: list[str]) -> str:
    lines = [*summary, ""]
    for item in report["checks"]:
        detail = {k: v for k, v in item.items() if k not in ("name", "ok")}
        shown = json.dumps(detail, default=str)
        lines.append(f"{'PASS' if item['ok'] else 'FAIL'}  {item['name']}  {shown[:300]}")
    failed = num_failed(report)
    lines += ["", f"{len(report['checks']) - failed} passed, {failed} failed"]
    return "\n".join(lines)


def first_difference(a: str, b: str) -> dict:
    """Where two texts part (for a report of mismatched twins)."""
    index = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if index is None:
        index = min(len(a), len(b))
    start = max(0, index - 20)
    return {"at": index, "streamed": a[start : index + 40], "twin": b[start : index + 40]}


@dataclass(slots=True)
class Common:
    """The options every suite takes."""

    models_dir: Path | None = None
    torch_threads: int | None = None
    startup_timeout_s: float = 300.0
    seed: int = 0


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (default: a summary)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the suite's choices")
    parser.add_argument(
        "--models-dir", type=Path, help="the models cache (default: $CACHET_DATA_DIR/models)"
    )
    parser.add_argument("--torch-threads", type=int, help="CACHET_TORCH_THREADS for the server")
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds")


def config_report(config: object, common: Common) -> dict:
    """A report's "config": the suite's own settings plus the shared ones that shape a run."""
    return {**asdict(config), "seed": common.seed, "torch_threads": common.torch_threads or 0}


def server_report(site: dict, *keys: str, **extra: object) -> dict:
    """A report's "server": the model it served, its KV cache and start-up, plus `keys`."""
    shown = ("model", "model_config", *keys, "kv_tokens", "startup_s")
    return {**{key: site[key] for key in shown}, **extra}


def common_of(args: argparse.Namespace) -> Common:
    return Common(
        models_dir=args.models_dir,
        torch_threads=args.torch_threads,
        startup_timeout_s=args.startup_timeout,
        seed=args.seed,
    )


def suite_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The command line of `python -m reliability.<name>`, with the options every suite takes."""
    parser = argparse.ArgumentParser(
        prog=f"python -m reliability.{name}", description=doc.splitlines()[0]
    )
    add_common_arguments(parser)
    return parser


def run_suite(
    args: argparse.Namespace,
    run: Callable[[object, Common], dict],
    config: object,
    summary: Callable[[dict], list[str]],
) -> int:
    """Run a suite from its parsed command line (see `main_of` for the exit status)."""
    return main_of(lambda: run(config, common_of(args)), as_json=args.json, summary=summary)


def main_of(run: Callable[[], dict], *, as_json: bool, summary: Callable[[dict], list[str]]) -> int:
    """Run a suite and print its report; 0 all checks passed, 1 some failed, 2 it could not run."""
    # NOTE: the openai client's transport logs every request at INFO: thousands of lines here.
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return run_cli(
        run,
        as_json=as_json,
        format_report=lambda report: format_checks(report, summary(report)),
        num_errors=num_failed,
    )
