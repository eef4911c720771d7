"""The chat UI's ES modules: an import graph without cycles, and hashed imports in production.

Production (`make run`, DEBUG off) serves what `collectstatic` wrote with
`chatsite.storage.HashedStaticFilesStorage`: every file under a content-hashed name, so the
browser may cache it forever. A module's `import ... from "./state.js"` must then name
`./state.<hash>.js`, or the hashed module loads the unhashed file (stale, or missing).
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client, override_settings

import frontend

STATIC_DIR = Path(frontend.__file__).parent / "static"
CHAT_DIR = "frontend/chat"
ENTRY_MODULE = f"{CHAT_DIR}/main.js"
# `import ... from "x";`, `export ... from "x";`, `import "x";` and `import("x")`: the module
# specifiers a browser resolves.
MODULE_SPECIFIER = re.compile(
    r"""\bfrom\s*["'](?P<from>[^"']+)["']|\bimport\s*\(?\s*["'](?P<bare>[^"']+)["']"""
)
HASHED_NAME = re.compile(r"\.[0-9a-f]{12}\.js$")


def imports_of(source: str) -> list[str]:
    return [match["from"] or match["bare"] for match in MODULE_SPECIFIER.finditer(source)]


def resolve(module: str, specifier: str) -> str:
    """The static path `specifier` names when imported by the module at static path `module`."""
    assert specifier.startswith("./") or specifier.startswith("../"), (
        f"{module} imports {specifier!r}: only relative imports resolve the same in development "
        "and production"
    )
    return posixpath.normpath(posixpath.join(posixpath.dirname(module), specifier))


def chat_modules() -> dict[str, list[str]]:
    """{static path of each chat module: the static paths it imports}."""
    graph = {}
    for path in sorted((STATIC_DIR / CHAT_DIR).glob("*.js")):
        module = path.relative_to(STATIC_DIR).as_posix()
        graph[module] = [resolve(module, spec) for spec in imports_of(path.read_text())]
    return graph


def test_the_chat_modules_import_each_other_without_cycles_and_main_reaches_every_one():
    graph = chat_modules()
    for module, targets in graph.items():
        for target in targets:
            assert target in graph, f"{module} imports {target}, which does not exist"

    # NOTE: a cycle would also make collectstatic fail: the hashes in it never settle.
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, "import cycle: " + " -> ".join((*path, module))
        if module in done:
            return
        for target in graph[module]:
            visit(target, (*path, module))
        done.add(module)

    visit(ENTRY_MODULE, ())
    assert done == set(graph), f"not imported from main.js: {sorted(set(graph) - done)}"


@pytest.fixture(scope="module")
def collected_static(tmp_path_factory):
    """`collectstatic` into a fresh STATIC_ROOT with the production storage, DEBUG off."""
    static_root = tmp_path_factory.mktemp("static")
    storages = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "chatsite.storage.HashedStaticFilesStorage"},
    }
    with override_settings(DEBUG=False, STATIC_ROOT=static_root, STORAGES=storages):
        call_command("collectstatic", "--noinput", verbosity=0)
        yield static_root


def test_collectstatic_rewrites_every_module_import_to_a_hashed_file_in_the_manifest(
    collected_static,
):
    manifest = json.loads((collected_static / "staticfiles.json").read_text())["paths"]
    hashed_names = set(manifest.values())
    modules = [name for name in manifest if name.startswith(f"{CHAT_DIR}/")]
    assert sorted(modules) == sorted(chat_modules())

    for module in modules:
        hashed = manifest[module]
        assert HASHED_NAME.search(hashed), hashed
        specifiers = imports_of((collected_static / hashed).read_text())
        assert len(specifiers) == len(chat_modules()[module])
        for specifier in specifiers:
            target = resolve(hashed, specifier)
            assert target in hashed_names, (
                f"{hashed} imports {specifier}, not a hashed file (a name hashed twice: a "
                "comment above the imports holds one of the keywords; see main.js)"
            )
            assert (collected_static / target).is_file(), target


@pytest.mark.django_db
def test_the_chat_page_loads_its_entry_module_by_its_hashed_name_when_debug_is_off(
    collected_static,
):
    client = Client()
    client.force_login(User.objects.create_user("alice"))
    page = client.get("/").content.decode()
    match = re.search(r'<script type="module" src="/static/(?P<path>[^"]+)"></script>', page)
    assert match, "no module script on the chat page"
    assert HASHED_NAME.search(match["path"]) and match["path"].startswith(f"{CHAT_DIR}/main.")
    assert (collected_static / match["path"]).is_file()
