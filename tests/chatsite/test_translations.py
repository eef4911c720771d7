"""locale/: every translation complete, each committed .mo compiled from its .po, and nothing in the
code or the templates left for makemessages to add; the templates show no text outside translate
tags, and the chat UI's modules none outside gettext.

The .mo files are committed so a clone runs without GNU gettext; the comparison with the .po is
pure Python. Only the extraction check runs makemessages (xgettext): `make test` installs gettext.
"""

from __future__ import annotations

import ast
import gettext
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.template.base import Lexer, TokenType
from django.test import override_settings
from django.utils.translation import to_locale

REPO_DIR = Path(settings.BASE_DIR)
LOCALE_DIR = Path(settings.LOCALE_PATHS[0])
CATALOGUES = sorted(LOCALE_DIR.glob("*/LC_MESSAGES/*.po"))
LANGUAGES = [code for code, _ in settings.LANGUAGES if code != "en"]
# What `make messages` leaves out of the extraction (the Makefile's MESSAGES_IGNORE): not shipped,
# or not ours.
NOT_EXTRACTED = ("var", "tests", "bench", "eval", "reliability", "harness", "docs", "deploy")
# What makemessages reads (and the catalogues it merges into).
EXTRACTED_SUFFIXES = (".py", ".html", ".txt", ".js", ".po")
VENDORED = REPO_DIR / "frontend" / "static" / "frontend" / "vendor"
TEMPLATES = sorted(
    path
    for folder in ("frontend/templates", "retrieval/templates")
    for path in (REPO_DIR / folder).rglob("*.html")
)
# The chat UI's modules and the staff dashboard's and evaluation page's.
CHAT_MODULES = sorted(
    path
    for folder in ("chat", "dashboard", "evaluation")
    for path in (REPO_DIR / "frontend" / "static" / "frontend" / folder).glob("*.js")
)
MAKE_MESSAGES = "make messages  (GNU gettext: apt-get install gettext)"


def read_po(path: Path) -> dict[str | tuple[str, int], str]:
    """A .po file as the .mo compiled from it reads in Python's gettext: {msgid: msgstr}, with
    "context\\x04msgid" keys for msgctxt and (msgid, n) for plural forms; fuzzy and obsolete
    entries left out, as msgfmt leaves them."""
    catalog: dict[str | tuple[str, int], str] = {}
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        lines = [line for line in block.strip().splitlines() if line]
        if any(line.startswith("#,") and "fuzzy" in line for line in lines):
            continue
        fields: dict[str, str] = {}
        field = None
        for line in lines:
            if line.startswith("#"):
                continue
            if line.startswith('"'):
                fields[field] += ast.literal_eval(line)
            else:
                field, _, quoted = line.partition(" ")
                fields[field] = ast.literal_eval(quoted)
        if "msgid" not in fields:
            continue
        msgid = fields["msgid"]
        if "msgctxt" in fields:
            msgid = f"{fields['msgctxt']}\x04{msgid}"
        if "msgid_plural" in fields:
            for name, text in fields.items():
                if name.startswith("msgstr["):
                    catalog[(msgid, int(name[7:-1]))] = text
        else:
            catalog[msgid] = fields["msgstr"]
    return catalog


def test_every_interface_language_has_both_catalogues():
    for language in LANGUAGES:
        folder = LOCALE_DIR / to_locale(language)
        assert (folder / "LC_MESSAGES" / "django.po").is_file(), folder
        assert (folder / "LC_MESSAGES" / "djangojs.po").is_file(), folder


@pytest.mark.parametrize("po", CATALOGUES, ids=lambda path: str(path.relative_to(LOCALE_DIR)))
def test_every_message_is_translated_and_none_is_fuzzy(po):
    text = po.read_text(encoding="utf-8")
    assert "#, fuzzy" not in text.split('msgid ""\nmsgstr ""', 1)[1], "fuzzy entries in " + po.name
    catalog = read_po(po)
    untranslated = [key for key, value in catalog.items() if key != "" and not value.strip()]
    assert not untranslated, f"{po}: untranslated {untranslated}"
    assert len(catalog) > 1


@pytest.mark.parametrize("po", CATALOGUES, ids=lambda path: str(path.relative_to(LOCALE_DIR)))
def test_each_committed_mo_file_holds_exactly_its_po_file(po):
    mo = po.with_suffix(".mo")
    assert mo.is_file(), f"{mo} is missing: run {MAKE_MESSAGES}"
    with mo.open("rb") as compiled:
        in_mo = gettext.GNUTranslations(compiled)._catalog  # type: ignore[attr-defined]
    in_po = read_po(po)
    # NOTE: msgfmt rewrites the header (it drops POT-Creation-Date); its plural rule must stay.
    assert plural_forms(in_mo.pop("")) == plural_forms(in_po.pop(""))
    assert in_mo == in_po, f"{mo} is stale: run {MAKE_MESSAGES}"


def plural_forms(header: str) -> str:
    return next(line for line in header.splitlines() if line.startswith("Plural-Forms:"))


def test_makemessages_finds_nothing_new_to_translate_and_nothing_gone(tmp_path, monkeypatch):
    if shutil.which("xgettext") is None or shutil.which("msgmerge") is None:
        pytest.fail(f"this check runs makemessages, which needs GNU gettext: {MAKE_MESSAGES}")
    # NOTE: makemessages writes into the locale folder; it runs on a copy of what it reads.
    copy = tmp_path / "repo"

    def skipped(folder: str, names: list[str]) -> list[str]:
        here = Path(folder)
        return [
            name
            for name in names
            if name.startswith(".")
            or (here == REPO_DIR and name in NOT_EXTRACTED)
            or here / name == VENDORED
            or ((here / name).is_file() and not name.endswith(EXTRACTED_SUFFIXES))
        ]

    shutil.copytree(REPO_DIR, copy, ignore=skipped)
    monkeypatch.chdir(copy)
    with override_settings(LOCALE_PATHS=[copy / "locale"]):
        for domain in ("django", "djangojs"):
            call_command(
                "makemessages",
                locale=[to_locale(code) for code in LANGUAGES],
                domain=domain,
                add_location="file",
                no_obsolete=True,
                verbosity=0,
            )
    for po in CATALOGUES:
        fresh = read_po(copy / po.relative_to(REPO_DIR))
        committed = read_po(po)
        fresh.pop("")
        committed.pop("")
        new = sorted(str(key) for key in fresh.keys() - committed.keys())
        gone = sorted(str(key) for key in committed.keys() - fresh.keys())
        assert not new and not gone, (
            f"{po.name} is out of date: new {new}, gone {gone}; run {MAKE_MESSAGES}"
        )


class VisibleText(HTMLParser):
    """Text a reader sees or hears: text outside script, style and svg, and the attributes that
    are read out or shown (aria-label, title, placeholder, alt, a button's value)."""

    SHOWN_ATTRIBUTES = {"aria-label", "title", "placeholder", "alt"}
    HIDDEN_ELEMENTS = {"script", "style", "svg"}

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []
        self.hidden_depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.HIDDEN_ELEMENTS:
            self.hidden_depth += 1
        attributes = dict(attrs)
        for name, value in attributes.items():
            if value and (
                name in self.SHOWN_ATTRIBUTES
                or (name == "value" and attributes.get("type") in {"submit", "button"})
            ):
                self.texts.append(value)

    def handle_endtag(self, tag):
        if tag in self.HIDDEN_ELEMENTS:
            self.hidden_depth -= 1

    def handle_data(self, data):
        if not self.hidden_depth:
            self.texts.append(data)


# Text that stays as it is in every language: the product's name, the logo's letter.
UNTRANSLATED_WORDS = {"Cachet", "C"}


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda path: path.name)
def test_templates_show_no_text_outside_translate_tags(template):
    # Every tag and variable becomes a placeholder: what is left is the template's own text.
    parts = []
    translated = False  # inside {% blocktranslate %}...{% endblocktranslate %}
    for token in Lexer(template.read_text()).tokenize():
        if token.token_type == TokenType.BLOCK:
            name = token.contents.split()[0]
            translated = name in {"blocktranslate", "blocktrans", "plural"} or (
                translated and name not in {"endblocktranslate", "endblocktrans"}
            )
        if token.token_type == TokenType.TEXT and not translated:
            parts.append(token.contents)
        elif token.token_type != TokenType.COMMENT:
            parts.append("\x00")
    source = "".join(parts)
    parser = VisibleText()
    parser.feed(source)
    # NOTE: a hyphenated word is a class name (`{% block body_class %}page-chat{% endblock %}`).
    words = {
        word
        for text in parser.texts
        for word in re.findall(r"[A-Za-z][A-Za-z-]*", text)
        if "-" not in word
    }
    assert words <= UNTRANSLATED_WORDS, f"{template}: untranslated {sorted(words)}"


# A string literal that reads as English: capitalised, or three words or more.
PROSE = re.compile(r'"([A-Z][a-z]+[ .…!?]?[^"]*|[a-z]+(?: [a-z\'\u2019]+){2,}[^"]*)"')
GETTEXT_ARGUMENTS = re.compile(r'\b[np]?gettext\(\s*"(?:[^"\\]|\\.)*"(?:\s*,\s*"(?:[^"\\]|\\.)*")*')
# Literals that are names, not text: keyboard keys and headers.
NOT_TEXT = {"Enter", "Escape", "Accept", "Content-Type"}


@pytest.mark.parametrize("module", CHAT_MODULES, ids=lambda path: path.name)
def test_chat_modules_show_no_text_outside_gettext(module):
    code = re.sub(r"/\*.*?\*/|^\s*//.*$|\s//.*$", "", module.read_text(), flags=re.S | re.M)
    code = GETTEXT_ARGUMENTS.sub("gettext(", code)
    english = [text for text in PROSE.findall(code) if text not in NOT_TEXT]
    assert not english, f"{module.name}: text not through gettext: {english}"
