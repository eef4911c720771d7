"""chatsite.settings, loaded in a fresh interpreter per environment, as a server would start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference.catalogue import DEFAULT_CHAT_MODEL

ROOT = Path(__file__).resolve().parents[2]
GOOD_KEY = "a-perfectly-good-secret-key-for-these-tests-only"
PROBE = (
    "import json, django; from django.conf import settings; django.setup(); print(json.dumps({"
    "'debug': settings.DEBUG, 'db': settings.DATABASES['default']['ENGINE'], "
    "'layer': settings.CHANNEL_LAYERS['default']['BACKEND'], "
    "'eager': settings.CELERY_TASK_ALWAYS_EAGER, 'broker': settings.CELERY_BROKER_URL, "
    "'data_dir': str(settings.DATA_DIR), 'hosts': settings.ALLOWED_HOSTS, "
    "'model': settings.CACHET_MODEL, 'model_cache': str(settings.CACHET_MODEL_CACHE)}))"
)


def run_with(environment: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CACHET_", "DATABASE_URL"))}
    clean.pop("REDIS_URL", None)
    clean |= {"DJANGO_SETTINGS_MODULE": "chatsite.settings"} | environment
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120
    )


def load_settings(environment: dict[str, str]) -> dict:
    result = run_with(environment, "-c", PROBE)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_defaults_are_sqlite_in_memory_layer_and_in_process_tasks(tmp_path: Path) -> None:
    loaded = load_settings({"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_DATA_DIR": str(tmp_path)})
    assert loaded["debug"] is False
    assert loaded["db"] == "django.db.backends.sqlite3"
    assert loaded["layer"] == "channels.layers.InMemoryChannelLayer"
    assert loaded["eager"] is True
    assert loaded["data_dir"] == str(tmp_path.resolve())
    assert loaded["hosts"] == ["localhost", "127.0.0.1", "[::1]"]
    assert loaded["model"] == DEFAULT_CHAT_MODEL


def test_the_chat_model_may_be_a_catalogue_name_cached_where_cachet_model_cache_says(
    tmp_path: Path,
) -> None:
    base = {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_DATA_DIR": str(tmp_path)}
    loaded = load_settings(base | {"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert loaded["model_cache"] == str(tmp_path / "xdg" / "cachet" / "models")
    loaded = load_settings(
        base | {"CACHET_MODEL": "gemma-3-270m", "CACHET_MODEL_CACHE": str(tmp_path / "models")}
    )
    assert (loaded["model"], loaded["model_cache"]) == ("gemma-3-270m", str(tmp_path / "models"))


def test_redis_url_switches_the_channel_layer_and_celery_to_redis(tmp_path: Path) -> None:
    loaded = load_settings(
        {
            "CACHET_SECRET_KEY": GOOD_KEY,
            "CACHET_DATA_DIR": str(tmp_path),
            "REDIS_URL": "redis://127.0.0.1:6379/3",
            "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test",
        }
    )
    assert loaded["layer"] == "channels_redis.core.RedisChannelLayer"
    assert loaded["eager"] is False
    assert loaded["broker"] == "redis://127.0.0.1:6379/3"
    assert loaded["db"] == "django.db.backends.postgresql"


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({}, "CACHET_SECRET_KEY: is required when CACHET_DEBUG is off"),
        ({"CACHET_DEBUG": "maybe"}, "CACHET_DEBUG: expected one of"),
        ({"CACHET_SECRET_KEY": GOOD_KEY, "DATABASE_URL": "oracle://x/y"}, "DATABASE_URL:"),
        ({"CACHET_SECRET_KEY": GOOD_KEY, "REDIS_URL": "localhost:6379"}, "REDIS_URL:"),
        ({"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_MODEL": "/nope/model.gguf"}, "CACHET_MODEL:"),
        (
            {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_MODEL": "qwen-9000"},
            "CACHET_MODEL: no model named 'qwen-9000' in the catalogue (smollm2-135m-instruct, ",
        ),
        (
            {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_MODEL_CACHE": "/etc/hostname"},
            "CACHET_MODEL_CACHE: /etc/hostname exists and is not a directory",
        ),
        (
            {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_EMBEDDING_MODEL": "bad id!"},
            "CACHET_EMBEDDING_MODEL:",
        ),
        (
            {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_EMBEDDING_MODEL": "e5-large"},
            "CACHET_EMBEDDING_MODEL: no model named 'e5-large' in the catalogue "
            "(all-MiniLM-L6-v2, multilingual-e5-small)",
        ),
        ({"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_ALLOWED_HOSTS": ","}, "CACHET_ALLOWED_HOSTS:"),
        (
            {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_CACHE_ISOLATION": "tenant"},
            "CACHET_CACHE_ISOLATION: expected shared or user",
        ),
        (
            {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_NATIVE_KERNELS": "maybe"},
            "CACHET_NATIVE_KERNELS: expected one of 1/0, true/false, yes/no, on/off; got 'maybe'",
        ),
        (
            {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_FUSED_DECODE": "2"},
            "CACHET_FUSED_DECODE: expected one of 1/0, true/false, yes/no, on/off; got '2'",
        ),
        (
            {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_PREFILL_ATTENTION": "flash"},
            "CACHET_PREFILL_ATTENTION: expected auto, native or pytorch",
        ),
        (
            {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_KV_CACHE_MB": "0"},
            "CACHET_KV_CACHE_MB: must be at least 1; got 0",
        ),
        (
            {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_DEVICE": "tpu"},
            "CACHET_DEVICE: device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'",
        ),
        (
            {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_LEXICAL_STORE": "lucene"},
            "CACHET_LEXICAL_STORE: expected auto, bm25s or postgresql; got 'lucene'",
        ),
        (
            {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_LEXICAL_STORE": "postgresql"},
            "CACHET_LEXICAL_STORE: postgresql needs a PostgreSQL DATABASE_URL; this is SQLite",
        ),
    ],
)
def test_a_bad_value_stops_start_up_with_one_line_naming_the_variable(
    environment: dict[str, str], message: str, tmp_path: Path
) -> None:
    result = run_with(environment | {"CACHET_DATA_DIR": str(tmp_path)}, "manage.py", "check")
    assert result.returncode == 2
    assert result.stderr.startswith("cachet: configuration error: Bad setting ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr


ENGINE_PROBE = (
    "import dataclasses, json, django; from django.conf import settings; django.setup(); "
    "from inference.engine import EngineConfig; "
    "print(json.dumps({'settings': [settings.CACHET_KV_CACHE_MB, settings.CACHET_TORCH_THREADS, "
    "settings.CACHET_NATIVE_KERNELS, settings.CACHET_FUSED_DECODE, "
    "settings.CACHET_ADAPTIVE_THREADS, settings.CACHET_DEVICE], 'engine': "
    "{f.name: f.default for f in dataclasses.fields(EngineConfig) if f.name in "
    "('kv_cache_mb', 'num_threads', 'native_kernels', 'fused_decode', 'adaptive_threads', "
    "'device')}}))"
)


def test_the_engine_settings_default_to_engine_configs_defaults(tmp_path: Path) -> None:
    environment = {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_DATA_DIR": str(tmp_path)}
    result = run_with(environment, "-c", ENGINE_PROBE)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    engine = loaded["engine"]
    assert loaded["settings"] == [
        engine["kv_cache_mb"],
        engine["num_threads"],
        engine["native_kernels"],
        engine["fused_decode"],
        engine["adaptive_threads"],
        engine["device"],
    ]
    assert loaded["settings"] == [512, 0, True, True, True, "cpu"]


def test_the_engine_flags_are_read_from_the_environment(tmp_path: Path) -> None:
    environment = {
        "CACHET_SECRET_KEY": GOOD_KEY,
        "CACHET_DATA_DIR": str(tmp_path),
        "CACHET_KV_CACHE_MB": "96",
        "CACHET_TORCH_THREADS": "2",
        "CACHET_NATIVE_KERNELS": "0",
        "CACHET_FUSED_DECODE": "off",
        "CACHET_ADAPTIVE_THREADS": "0",
        "CACHET_DEVICE": "auto",
    }
    result = run_with(environment, "-c", ENGINE_PROBE)
    assert result.returncode == 0, result.stderr
    settings = json.loads(result.stdout.strip().splitlines()[-1])["settings"]
    assert settings == [96, 2, False, False, False, "cuda" if torch.cuda.is_available() else "cpu"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_asking_for_cuda_without_a_cuda_device_stops_start_up_naming_the_build(
    tmp_path: Path,
) -> None:
    environment = {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_DATA_DIR": str(tmp_path)}
    result = run_with(environment | {"CACHET_DEVICE": "cuda"}, "manage.py", "check")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "CACHET_DEVICE: device 'cuda': PyTorch sees no CUDA device (torch " in result.stderr


def test_torch_threads_are_set_process_wide_when_configured(tmp_path: Path) -> None:
    probe = "import django, torch; django.setup(); print(torch.get_num_threads())"
    environment = {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_DATA_DIR": str(tmp_path)}
    result = run_with(environment | {"CACHET_TORCH_THREADS": "1"}, "-c", probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "1"


def test_the_documented_production_settings_pass_the_deploy_checks(tmp_path: Path) -> None:
    production = {
        "CACHET_SECRET_KEY": "k" * 20
        + "production-secret-key-of-sufficient-length-and-variety-9f3a",
        "CACHET_DATA_DIR": str(tmp_path),
        "CACHET_ALLOWED_HOSTS": "chat.example.com",
        "CACHET_CSRF_TRUSTED_ORIGINS": "https://chat.example.com",
        "CACHET_HTTPS": "1",
    }
    result = run_with(production, "manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    without_https = run_with(
        production | {"CACHET_HTTPS": "0"}, "manage.py", "check", "--deploy", "--fail-level",
        "WARNING",
    )  # fmt: skip
    assert without_https.returncode != 0  # the checks do notice what HTTPS settings bring


DISK_TIER_PROBE = (
    "import json, django; from django.conf import settings; django.setup(); "
    "from pathlib import Path; from inference.models import ModelConfig; "
    "config = ModelConfig(name='probe').engine_config(Path('.')); "
    "print(json.dumps([str(config.kv_disk_cache_dir), config.kv_disk_cache_mb]))"
)


@pytest.mark.parametrize(
    ("variables", "expected_dir", "expected_mb"),
    [
        ({}, "{data}/kv-cache", 4096),
        ({"CACHET_KV_DISK_CACHE_DIR": "off"}, "None", 4096),
        ({"CACHET_KV_DISK_CACHE_DIR": "{data}/elsewhere", "CACHET_KV_DISK_CACHE_MB": "64"},
         "{data}/elsewhere", 64),
    ],
)  # fmt: skip
def test_the_kv_disk_tier_is_on_in_the_data_dir_unless_turned_off(
    tmp_path: Path, variables: dict[str, str], expected_dir: str, expected_mb: int
) -> None:
    data = str(tmp_path.resolve())
    environment = {"CACHET_SECRET_KEY": GOOD_KEY, "CACHET_DATA_DIR": data}
    environment |= {name: value.format(data=data) for name, value in variables.items()}
    result = run_with(environment, "-c", DISK_TIER_PROBE)
    assert result.returncode == 0, result.stderr
    disk_dir, disk_mb = json.loads(result.stdout.strip().splitlines()[-1])
    assert disk_dir == expected_dir.format(data=data)
    assert disk_mb == expected_mb
