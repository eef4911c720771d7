"""Prefix-aware against random routing of remote replicas: second turns' cached share and TTFT.

Starts two Cachet replicas (real daphne servers, `harness.live_server.LiveServer`, on the chat
model of `--model`, one torch thread each) and, per routing mode, a front Cachet server with
CACHET_ROUTING=<mode>, both replicas as its remote backends of one model and an assistant profile
routed `remote`, so every turn goes to a replica. Through each front in turn it runs the RAG chat
load of `bench.chat` (`--chats` concurrent WebSocket chats of `--turns` turns over the handbook
collection, the same questions in both modes), so the modes run one after the other on the same
replicas and are reported side by side.

NOTE: each mode's front has API keys of its own users on the replicas, which run with
CACHET_CACHE_ISOLATION=user: a mode's requests carry their own prefix-cache salt, so no mode
finds blocks another mode cached (each starts cold) without restarting the replicas.

Reports per mode and turn: client-side TTFT p50/p95, the replicas' TTFT p50 (as the front
measured it), the cached share (cached / prompt tokens, the replicas' usage), and how many later
turns reached the replica that answered their chat's first turn.

    python -m bench.replica_routing                  # 16 chats x 3 turns, 64-token answers
    python -m bench.replica_routing --smoke --json   # 2 chats x 2 turns, 4-token answers
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.chat import LOG_TAIL_CHARS, drive, site_spec, summarize
from harness import (
    SITE_TIMEOUT_S,
    CannotRunError,
    ChatClient,
    LiveServer,
    LiveServerError,
    TurnResult,
    counts,
    cpu_name,
    default_models_dir,
    rounded,
    run_cli,
)

logger = logging.getLogger(__name__)

MODES = ("random", "prefix")
DEFAULT_MODEL = "smollm2-135m-instruct"
NUM_REPLICAS = 2


def backends_of(replicas: Sequence[LiveServer], sites: Sequence[dict], mode_index: int) -> list:
    """InferenceBackend fields of the replicas (one model: the front's pool), with the API keys
    of mode `mode_index`."""
    return [
        {
            "name": f"replica-{index + 1}",
            "base_url": f"{server.url}/v1",
            "api_key": site["api_keys"][mode_index],
            "model": site["model"],
        }
        for index, (server, site) in enumerate(zip(replicas, sites, strict=True))
    ]


def in_parallel(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """The results of `calls`, run at once (server start-ups mostly wait)."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


def start_servers(
    stack: contextlib.ExitStack,
    modes: Sequence[str],
    env: dict[str, str],
    *,
    spec: dict,
    models_dir: Path,
    kv_cache_mb: int,
) -> tuple[list[LiveServer], dict[str, tuple[LiveServer, dict]]]:
    """The started replicas and, per mode, its started front server with its site."""
    replica_env = env | {"CACHET_CACHE_ISOLATION": "user"}
    replicas = [
        stack.enter_context(
            LiveServer(
                models_dir=models_dir, env=replica_env, torch_threads=1, kv_cache_mb=kv_cache_mb
            )
        )
        for _ in range(NUM_REPLICAS)
    ]
    fronts = [
        stack.enter_context(
            LiveServer(models_dir=models_dir, env=env | {"CACHET_ROUTING": mode}, torch_threads=1)
        )
        for mode in modes
    ]
    sites = in_parallel(
        [
            functools.partial(server.call, "harness.site:add_api_keys", "replica", len(modes))
            for server in replicas
        ]
    )

    def prepare_front(index: int) -> dict:
        front_spec = spec | {"backends": backends_of(replicas, sites, index)}
        site = fronts[index].call("harness.site:prepare_site", front_spec, timeout=SITE_TIMEOUT_S)
        fronts[index].start()
        return site

    front_sites = in_parallel(
        [server.start for server in replicas]
        + [functools.partial(prepare_front, index) for index in range(len(modes))]
    )[len(replicas) :]
    return replicas, {
        mode: (front, site) for mode, front, site in zip(modes, fronts, front_sites, strict=True)
    }


def same_replica_shares(results: list[TurnResult], turns: int) -> dict[str, float | None]:
    """Per later turn: the share of answers from the replica that answered their chat's turn 1."""
    first = {r.chat: r.stats["backend"] for r in results if r.turn == 1 and r.stats}
    shares: dict[str, float | None] = {}
    for number in range(2, turns + 1):
        later = [r for r in results if r.turn == number and r.stats and r.chat in first]
        same = sum(r.stats["backend"] == first[r.chat] for r in later)
        shares[str(number)] = rounded(same / len(later), 3) if later else None
    return shares


def run_mode(
    front: LiveServer, site: dict, *, chats: int, turns: int, turn_timeout_s: float
) -> dict:
    """The chat load through `front`; its summary."""
    client = ChatClient(
        port=front.port,
        cookie=f"{site['cookie_name']}={site['sessions'][0]}",
        profile_id=site["profile_id"],
        collection_ids=site["collection_ids"],
        turn_timeout_s=turn_timeout_s,
    )
    results, warm, wall_s = asyncio.run(drive(client, chats=chats, turns=turns, warmup=True))
    if any(r.error is not None for r in results):
        tail = front.log_tail(LOG_TAIL_CHARS)
        logger.warning("turns failed; the front's log ends:\n%s", tail)
    answered = [r for r in results if r.stats]
    return {
        **summarize(results, turns, wall_s),
        "same_replica_share": same_replica_shares(results, turns),
        "answers_by_replica": counts(r.stats["backend"] for r in answered),
        "routes": counts(r.stats["route"] for r in answered),
        "model": next((r.stats["model"] for r in answered), None),
        "warmup_ttft_s": rounded(warm.ttft_s) if warm else None,
    }


def run_bench(
    *,
    chats: int = 16,
    turns: int = 3,
    max_tokens: int = 64,
    top_k: int | None = None,
    modes: Sequence[str] = MODES,
    model: str = DEFAULT_MODEL,
    models_dir: Path | None = None,
    kv_cache_mb: int = 1024,
    turn_timeout_s: float = 600.0,
) -> dict:
    """Both routing modes over the same two replicas (see the module doc); the report."""
    if chats < 1 or turns < 2 or max_tokens < 1:
        raise ValueError("chats and max_tokens must be at least 1, turns at least 2")
    if not modes or set(modes) - set(MODES) or len(set(modes)) != len(modes):
        raise ValueError(f"modes are among {', '.join(MODES)}, each once")
    models_dir = Path(models_dir) if models_dir is not None else default_models_dir()
    models_dir.mkdir(parents=True, exist_ok=True)
    spec = site_spec(max_tokens=max_tokens, top_k=top_k, with_documents=True)
    spec["profile"]["routing"] = "remote"
    load_start = os.getloadavg()[0]
    began = time.perf_counter()
    by_mode = {}
    try:
        with contextlib.ExitStack() as stack:
            replicas, fronts = start_servers(
                stack,
                modes,
                {"CACHET_MODEL": model},
                spec=spec,
                models_dir=models_dir,
                kv_cache_mb=kv_cache_mb,
            )
            setup_s = time.perf_counter() - began
            logger.info(
                "%d replicas and %d fronts ready in %.1fs", len(replicas), len(modes), setup_s
            )
            for mode, (front, site) in fronts.items():
                logger.info("routing %s: %d chats x %d turns", mode, chats, turns)
                by_mode[mode] = run_mode(
                    front, site, chats=chats, turns=turns, turn_timeout_s=turn_timeout_s
                )
                by_mode[mode]["document_chunks"] = site["document_chunks"]
            # NOTE: throwaway servers: SIGKILL spares waiting for their graceful shutdowns.
            in_parallel([server.kill for server in [*replicas, *(f for f, _ in fronts.values())]])
    except LiveServerError as error:
        raise CannotRunError(str(error)) from None
    return {
        "config": {
            "chats": chats,
            "turns": turns,
            "max_tokens": max_tokens,
            "search_top_k": top_k,
            "model": model,
            "replicas": NUM_REPLICAS,
            "torch_threads_per_server": 1,
            "replica_kv_cache_mb": kv_cache_mb,
            "cpu": cpu_name(),
            "cpu_count": os.cpu_count(),
            "load_avg_1m_start": round(load_start, 2),
            "load_avg_1m_end": round(os.getloadavg()[0], 2),
            "setup_s": rounded(setup_s, 1),
            "wall_s": rounded(time.perf_counter() - began, 1),
        },
        "modes": by_mode,
        "errors": sum(report["errors"] for report in by_mode.values()),
    }


def format_report(report: dict) -> str:
    config = report["config"]
    modes = list(report["modes"])
    lines = [
        f"{config['chats']} chats x {config['turns']} turns, max_tokens {config['max_tokens']}, "
        f"{config['replicas']} replicas of {config['model']}, {config['cpu_count']} CPUs "
        f"({config['cpu']}, load {config['load_avg_1m_start']} at the start)",
        "",
        f"{'turn':>4} {'routing':>8} {'ttft p50':>9} {'ttft p95':>9} {'replica p50':>11} "
        f"{'prompt tok':>10} {'cached':>7} {'same replica':>12}",
    ]

    def show(value, unit="", digits=2):
        return "-" if value is None else f"{value:.{digits}f}{unit}"

    for number in map(str, range(1, config["turns"] + 1)):
        for mode in modes:
            turn = report["modes"][mode]["turns"][number]
            same = report["modes"][mode]["same_replica_share"].get(number)
            lines.append(
                f"{number:>4} {mode:>8} {show(turn['ttft_p50_s'], 's'):>9} "
                f"{show(turn['ttft_p95_s'], 's'):>9} {show(turn['server_ttft_p50_s'], 's'):>11} "
                f"{show(turn['prompt_tokens_mean'], '', 0):>10} "
                f"{show(turn['cached_share'] and turn['cached_share'] * 100, '%', 0):>7} "
                f"{show(same and same * 100, '%', 0):>12}"
            )
    lines.append("")
    for mode in modes:
        summary = report["modes"][mode]
        lines.append(
            f"{mode}: answers by replica {summary['answers_by_replica']}, routes "
            f"{summary['routes']}, errors {summary['errors']}, wall {summary['wall_s']} s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.replica_routing", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--chats", type=int, default=16, help="concurrent chats (default 16)")
    parser.add_argument("--turns", type=int, default=3, help="turns per chat (default 3)")
    parser.add_argument("--max-tokens", type=int, default=64, help="answer length (default 64)")
    parser.add_argument("--top-k", type=int, help="passages per turn (default: the server's)")
    parser.add_argument(
        "--modes", default=",".join(MODES), help="routing modes, in order (default random,prefix)"
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"default {DEFAULT_MODEL}")
    parser.add_argument("--kv-cache-mb", type=int, default=1024, help="per replica (default 1024)")
    parser.add_argument("--smoke", action="store_true", help="2 chats x 2 turns, 4-token answers")
    parser.add_argument(
        "--models-dir", type=Path, help="models cache to reuse (default: $CACHET_DATA_DIR/models)"
    )
    parser.add_argument("--turn-timeout", type=float, default=600.0, help="seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.chats, args.turns, args.max_tokens, args.top_k = 2, 2, 4, 1
    modes = [mode.strip() for mode in args.modes.split(",")]
    if min(args.chats, args.max_tokens) < 1 or args.turns < 2 or set(modes) - set(MODES):
        parser.error(f"--chats, --max-tokens at least 1, --turns at least 2, --modes of {MODES}")
    return run_cli(
        lambda: run_bench(
            chats=args.chats,
            turns=args.turns,
            max_tokens=args.max_tokens,
            top_k=args.top_k,
            modes=modes,
            model=args.model,
            models_dir=args.models_dir,
            kv_cache_mb=args.kv_cache_mb,
            turn_timeout_s=args.turn_timeout,
        ),
        as_json=args.json,
        format_report=format_report,
        num_errors=lambda report: report["errors"],
    )


if __name__ == "__main__":
    sys.exit(main())
