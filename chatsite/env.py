"""Typed readers for environment variables that fail loudly on bad values.

Every reader takes the environment mapping explicitly so tests can pass a plain dict, and raises
`ConfigError` with a message that names the variable and what is wrong with it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import overload
from urllib.parse import urlparse

from inference.catalogue import names_a_catalogue_model

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})
DATABASE_SCHEMES = frozenset({"sqlite", "postgres", "postgresql", "pgsql", "mysql"})
REDIS_SCHEMES = frozenset({"redis", "rediss", "unix"})
# A Hugging Face repo id: "name" or "owner/name", letters, digits, '-', '_', '.'.
HF_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
MIN_SECRET_KEY_LENGTH = 32


class ConfigError(ValueError):
    """A setting read from the environment has a bad value."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable
        self.problem = problem


@overload
def read_str(env: Mapping[str, str], name: str, default: str) -> str: ...
@overload
def read_str(env: Mapping[str, str], name: str, default: None = None) -> str | None: ...
def read_str(env: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip()


def read_choice(env: Mapping[str, str], name: str, default: str, choices: Sequence[str]) -> str:
    """One of `choices` (ConfigError naming them, in their order, for anything else)."""
    value = read_str(env, name, default)
    if value not in choices:
        expected = f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else choices[0]
        raise ConfigError(name, f"expected {expected}; got {value!r}")
    return value


def read_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ConfigError(name, f"expected one of 1/0, true/false, yes/no, on/off; got {value!r}")


def read_int(env: Mapping[str, str], name: str, default: int, *, minimum: int | None = None) -> int:
    value = read_str(env, name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(name, f"expected a whole number; got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ConfigError(name, f"must be at least {minimum}; got {number}")
    return number


def read_list(env: Mapping[str, str], name: str, default: list[str]) -> list[str]:
    value = read_str(env, name)
    if value is None:
        return list(default)
    items = [item.strip() for item in value.split(",")]
    if any(item == "" for item in items):
        raise ConfigError(name, f"a comma-separated list must not have empty items; got {value!r}")
    return items


def read_secret_key(env: Mapping[str, str], name: str, *, debug: bool) -> str:
    value = read_str(env, name)
    if value is None:
        if debug:
            # NOTE: only for local development; production refuses to start without a real key.
            return "cachet-insecure-development-key-" + "x" * 32
        raise ConfigError(name, "is required when CACHET_DEBUG is off (use a long random string)")
    if len(value) < MIN_SECRET_KEY_LENGTH:
        raise ConfigError(
            name, f"must be at least {MIN_SECRET_KEY_LENGTH} characters; got {len(value)}"
        )
    return value


def read_database_url(env: Mapping[str, str], name: str, default: str) -> str:
    value = read_str(env, name) or default
    scheme = urlparse(value).scheme
    if scheme not in DATABASE_SCHEMES:
        raise ConfigError(
            name,
            f"unsupported scheme {scheme!r}; use sqlite:///path or postgres://user@host:port/db",
        )
    if scheme != "sqlite" and not urlparse(value).path.strip("/"):
        raise ConfigError(name, "names no database (expected .../DATABASE_NAME at the end)")
    return value


def read_redis_url(env: Mapping[str, str], name: str) -> str | None:
    value = read_str(env, name)
    if value is None:
        return None
    parsed = urlparse(value)
    if parsed.scheme not in REDIS_SCHEMES:
        raise ConfigError(name, f"expected redis://host:port/db; got scheme {parsed.scheme!r}")
    if parsed.scheme != "unix" and not parsed.hostname:
        raise ConfigError(name, f"names no host; got {value!r}")
    try:
        parsed.port  # noqa: B018 - urlparse validates the port lazily
    except ValueError:
        raise ConfigError(name, f"has an invalid port; got {value!r}") from None
    return value


def read_directory(env: Mapping[str, str], name: str, default: Path) -> Path:
    value = read_str(env, name)
    path = Path(value).expanduser() if value is not None else default
    if path.exists() and not path.is_dir():
        raise ConfigError(name, f"{path} exists and is not a directory")
    return path.resolve()


def read_optional_directory(env: Mapping[str, str], name: str, default: Path) -> Path | None:
    """A directory, or None where the variable turns the feature off ("off", "0", "no"...)."""
    value = read_str(env, name)
    if value is not None and value.lower() in FALSE_WORDS:
        return None
    return read_directory(env, name, default)


@overload
def read_model_source(
    env: Mapping[str, str], name: str, default: str, *, catalogue: Collection[str] = ()
) -> str: ...
@overload
def read_model_source(
    env: Mapping[str, str], name: str, default: None = None, *, catalogue: Collection[str] = ()
) -> str | None: ...
def read_model_source(
    env: Mapping[str, str],
    name: str,
    default: str | None = None,
    *,
    catalogue: Collection[str] = (),
) -> str | None:
    """A model given as a Hugging Face repo id, a local directory, or a .gguf file.

    With `catalogue` (names of the model catalogue, `inference.catalogue`), also a catalogue name;
    a one-word value that is none of them is refused with the names listed. Unset: `default`.
    """
    value = read_str(env, name)
    if value is None:
        return default
    looks_like_path = value.startswith(("/", ".", "~")) or value.endswith(".gguf")
    path = Path(value).expanduser()
    if looks_like_path or path.exists():
        if not path.exists():
            raise ConfigError(name, f"no such file or directory: {path}")
        if path.is_file() and path.suffix != ".gguf":
            raise ConfigError(name, f"a model file must be a .gguf file; got {path}")
        return str(path.resolve())
    if catalogue and names_a_catalogue_model(value):
        if value not in catalogue:
            raise ConfigError(
                name,
                f"no model named {value!r} in the catalogue ({', '.join(catalogue)}); "
                "or give a Hugging Face id (owner/name), a directory or a .gguf file",
            )
        return value
    if not HF_REPO_ID.match(value):
        raise ConfigError(
            name,
            f"expected a Hugging Face id (owner/name), a directory or a .gguf file; got {value!r}",
        )
    return value
