"""Why a document failed, stored in no language and shown in each viewer's.

A `Reason` is an English message id (marked for translation where it is written, with
`gettext_noop`) and the values of its `%(name)s` placeholders. A failed Document keeps both:
`error`, the English text (what API clients have always read, the log and the CLI), and
`error_reason`, the id and values, from which every page renders the reason in its viewer's
language (`Document.get_error_display`). Values are details the message quotes (a file suffix, a
limit, a parser's own words): they are shown as they are. Rows failed before `error_reason`
existed hold the English text alone; it is shown as it is, translated where the whole text is a
message id (those without values).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.utils.translation import gettext

logger = logging.getLogger(__name__)

Value = str | int


@dataclass(frozen=True, slots=True)
class Reason:
    message: str  # the English message id, with `%(name)s` placeholders for `params`
    params: Mapping[str, Value] = field(default_factory=dict)

    def english(self) -> str:
        return _format(self.message, self.params)

    def translated(self) -> str:
        """In the active language; the English text where the translation does not fit."""
        try:
            return _format(gettext(self.message), self.params)
        except (KeyError, ValueError, TypeError):
            logger.warning("the translation of %r does not fit its values", self.message)
            return self.english()

    def as_json(self) -> dict[str, Any]:
        return {"message": self.message, "params": dict(self.params)}

    @classmethod
    def from_json(cls, data: object) -> Reason | None:
        """The reason `as_json` stored; None for anything else (an empty or foreign value)."""
        if not isinstance(data, dict) or not isinstance(data.get("message"), str):
            return None
        params = data.get("params") or {}
        if not isinstance(params, dict):
            return None
        return cls(data["message"], {str(k): v for k, v in params.items()})


def _format(message: str, params: Mapping[str, Value]) -> str:
    # NOTE: a message without values is used as it is, so it may hold a literal "%".
    return message % params if params else message


def display(error: str, stored: object) -> str:
    """A document's failure reason in the active language: from `stored` (its `error_reason`),
    else the English `error` text as it is (translated where it is a whole message id)."""
    if not error:
        return ""
    reason = Reason.from_json(stored)
    if reason is None:
        return gettext(error)
    try:
        return reason.translated()
    except (KeyError, ValueError, TypeError):  # stored values that do not fit the message
        return error
