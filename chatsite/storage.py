"""The production static files storage: WhiteNoise's compressed manifest, for ES modules too."""

from __future__ import annotations

from whitenoise.storage import CompressedManifestStaticFilesStorage


class HashedStaticFilesStorage(CompressedManifestStaticFilesStorage):
    """Hashed, compressed static files whose JavaScript imports point at the hashed names.

    Without `support_js_module_import_aggregation`, `import ... from "./state.js"` in a hashed
    module would load the unhashed file (stale behind a far-future cache header, or missing).
    Django finds those statements with regular expressions that also match from the keyword in
    a comment above them, and then rewrite a name twice; main.js says how the modules avoid it,
    and tests/frontend/test_static_modules.py checks every rewritten name.
    """

    support_js_module_import_aggregation = True
    # NOTE: a module's hash depends on its imports' hashed names, and the files are processed in
    # the order they are found: in the worst order each pass settles one more level, so a chain
    # needs as many passes as it has modules (the chat UI's longest has 8; Django's default is
    # 5). An import cycle never settles: collectstatic fails "Max post-process passes exceeded".
    max_post_process_passes = 20
