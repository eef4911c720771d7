"""chatsite.env: readers accept good values and name the variable in the error for bad ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatsite import env
from inference import catalogue


def test_booleans_accept_the_usual_words_and_reject_others() -> None:
    assert env.read_bool({"X": "Yes"}, "X", default=False) is True
    assert env.read_bool({"X": "off"}, "X", default=True) is False
    assert env.read_bool({}, "X", default=True) is True
    with pytest.raises(env.ConfigError, match=r"^X: expected one of .* got 'maybe'"):
        env.read_bool({"X": "maybe"}, "X", default=False)


def test_integers_must_be_whole_numbers_above_the_minimum() -> None:
    assert env.read_int({"N": " 42 "}, "N", default=1) == 42
    with pytest.raises(env.ConfigError, match="N: expected a whole number; got '4.5'"):
        env.read_int({"N": "4.5"}, "N", default=1)
    with pytest.raises(env.ConfigError, match="N: must be at least 1; got 0"):
        env.read_int({"N": "0"}, "N", default=1, minimum=1)


def test_a_choice_is_one_of_its_words_and_an_error_names_them_all() -> None:
    choices = ("auto", "faiss", "pgvector")
    assert env.read_choice({"S": " pgvector "}, "S", default="auto", choices=choices) == "pgvector"
    assert env.read_choice({}, "S", default="auto", choices=choices) == "auto"
    with pytest.raises(env.ConfigError, match="S: expected auto, faiss or pgvector; got 'fais'"):
        env.read_choice({"S": "fais"}, "S", default="auto", choices=choices)


def test_lists_split_on_commas_and_refuse_empty_items() -> None:
    assert env.read_list({"H": "a.example, b.example"}, "H", default=[]) == [
        "a.example",
        "b.example",
    ]
    assert env.read_list({}, "H", default=["localhost"]) == ["localhost"]
    with pytest.raises(env.ConfigError, match="H: a comma-separated list must not have empty"):
        env.read_list({"H": "a,,b"}, "H", default=[])


def test_secret_key_is_required_and_long_unless_debugging() -> None:
    with pytest.raises(env.ConfigError, match="CACHET_SECRET_KEY: is required when CACHET_DEBUG"):
        env.read_secret_key({}, "CACHET_SECRET_KEY", debug=False)
    with pytest.raises(env.ConfigError, match="must be at least 32 characters; got 5"):
        env.read_secret_key({"CACHET_SECRET_KEY": "short"}, "CACHET_SECRET_KEY", debug=False)
    assert len(env.read_secret_key({}, "CACHET_SECRET_KEY", debug=True)) >= 32
    key = "k" * 40
    assert env.read_secret_key({"CACHET_SECRET_KEY": key}, "CACHET_SECRET_KEY", debug=False) == key


def test_database_url_accepts_sqlite_and_postgres_and_names_bad_schemes() -> None:
    assert env.read_database_url({}, "DATABASE_URL", "sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    url = "postgres://postgres@127.0.0.1:5432/test"
    assert env.read_database_url({"DATABASE_URL": url}, "DATABASE_URL", "") == url
    with pytest.raises(env.ConfigError, match="DATABASE_URL: unsupported scheme 'mongodb'"):
        env.read_database_url({"DATABASE_URL": "mongodb://h/db"}, "DATABASE_URL", "")
    with pytest.raises(env.ConfigError, match="DATABASE_URL: names no database"):
        env.read_database_url({"DATABASE_URL": "postgres://h:5432"}, "DATABASE_URL", "")


def test_redis_url_is_optional_but_must_be_a_redis_address_when_set() -> None:
    assert env.read_redis_url({}, "REDIS_URL") is None
    url = "redis://127.0.0.1:6379/0"
    assert env.read_redis_url({"REDIS_URL": url}, "REDIS_URL") == url
    with pytest.raises(env.ConfigError, match="REDIS_URL: expected redis://host:port/db"):
        env.read_redis_url({"REDIS_URL": "http://127.0.0.1:6379"}, "REDIS_URL")
    with pytest.raises(env.ConfigError, match="REDIS_URL: has an invalid port"):
        env.read_redis_url({"REDIS_URL": "redis://127.0.0.1:notaport/0"}, "REDIS_URL")


def test_data_dir_must_not_be_an_existing_file(tmp_path: Path) -> None:
    assert env.read_directory({}, "D", default=tmp_path / "new") == (tmp_path / "new").resolve()
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(env.ConfigError, match="D: .* exists and is not a directory"):
        env.read_directory({"D": str(file)}, "D", default=tmp_path)


def test_model_source_accepts_hub_ids_directories_and_gguf_files(tmp_path: Path) -> None:
    assert env.read_model_source({}, "M") is None
    assert env.read_model_source({"M": "HuggingFaceTB/SmolLM2-360M-Instruct"}, "M") == (
        "HuggingFaceTB/SmolLM2-360M-Instruct"
    )
    assert env.read_model_source({"M": str(tmp_path)}, "M") == str(tmp_path.resolve())
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert env.read_model_source({"M": str(gguf)}, "M") == str(gguf.resolve())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("/no/such/model", "M: no such file or directory: /no/such/model"),
        ("./missing.gguf", "M: no such file or directory"),
        ("not a model id!", "M: expected a Hugging Face id"),
        ("a/b/c", "M: expected a Hugging Face id"),
    ],
)
def test_model_source_names_what_is_wrong(value: str, message: str) -> None:
    with pytest.raises(env.ConfigError, match=message):
        env.read_model_source({"M": value}, "M")


def test_model_source_accepts_a_catalogue_name_and_lists_the_catalogue_for_others() -> None:
    names = catalogue.CATALOGUE
    read = env.read_model_source
    assert read({"M": "gemma-3-270m"}, "M", catalogue=names) == "gemma-3-270m"
    assert read({}, "M", default="qwen2.5-coder-1.5b-instruct", catalogue=names) == (
        "qwen2.5-coder-1.5b-instruct"
    )
    assert read({"M": "Qwen/Qwen2.5-0.5B"}, "M", catalogue=names) == "Qwen/Qwen2.5-0.5B"
    with pytest.raises(env.ConfigError) as caught:
        read({"M": "qwen2.5-coder-7b"}, "M", catalogue=names)
    assert str(caught.value) == (
        "M: no model named 'qwen2.5-coder-7b' in the catalogue (smollm2-135m-instruct, "
        "qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct, gemma-3-270m); or give a "
        "Hugging Face id (owner/name), a directory or a .gguf file"
    )
    # Without a catalogue (the embedding model) a one-word hub id is still a hub id.
    assert read({"M": "all-MiniLM-L6-v2"}, "M") == "all-MiniLM-L6-v2"


def test_model_source_refuses_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"x")
    with pytest.raises(env.ConfigError, match="a model file must be a .gguf file"):
        env.read_model_source({"M": str(weights)}, "M")
