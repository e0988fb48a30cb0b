# Polychip: `make` alone lists the targets.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The tests run against the real services: PostgreSQL, and Redis for Celery and Channels.
TEST_ENV := DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/polychip} \
	CELERY_BROKER_URL=$${TEST_BROKER_URL:-redis://127.0.0.1:6379/14} \
	CHANNEL_REDIS_URL=$${TEST_CHANNEL_REDIS_URL:-redis://127.0.0.1:6379/15} \
	POLYCHIP_VAR_DIR=$(CURDIR)/var/test \
	POLYCHIP_PASSWORD_HASHERS=django.contrib.auth.hashers.MD5PasswordHasher
# One pytest-xdist worker per core, four at most; tests/workers.py gives each its own Redis databases and
# var folder (pytest-django its own database), two Redis databases down per worker from 14 and 15. A
# file's tests stay in one worker, so a module's live stack starts once; files go out in collection order,
# those with a slow test first (tests/conftest.py), not xdist's default of most tests first, which left a
# one-test file of four minutes for last. TEST_WORKERS=0 runs every test in one process.
TEST_WORKERS ?= auto
PYTEST := $(BIN)/pytest -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile --no-loadscope-reorder

.DEFAULT_GOAL := help
.PHONY: help install vendor services demo up down status test test-properties test-unit test-integration test-runtime test-e2e test-security lint openapi fmt bench clean

help: ## List the targets
	@grep -hE '^[a-z][a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml package-lock.json
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel of torch first, by exact version, so nothing pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# Browser assets from npm (package-lock.json): axe-core for the e2e tier; uPlot, whose built file is
	# vendored under frontend/static/vendor (`make vendor` refreshes it), so that serving needs no npm.
	if command -v npm >/dev/null; then npm ci --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: install Node.js; the e2e tier's accessibility checks need axe-core from npm"; fi
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install Polychip with its test tools

services: ## Start PostgreSQL and Redis if down, install Chromium if missing (root; .ci/services)
	@.ci/services

demo: install ## Install and run the demo job on the embedded default (servers stay up; ARGS=--stop stops them)
	$(BIN)/polychip demo $(ARGS)

up: install ## Start the ASGI server, a Celery worker and beat on the embedded default, no demo job
	$(BIN)/polychip up

down: ## Stop what `make up` or `make demo` started
	@test -x $(BIN)/polychip && $(BIN)/polychip down || true

status: ## Show which servers run
	$(BIN)/polychip status

test: install services ## Install and run every test tier against PostgreSQL and Redis on 127.0.0.1
	$(TEST_ENV) $(PYTEST) $(PYTEST_ARGS)

test-properties: install services ## Billing's ledger properties, 10,000 Hypothesis examples each (about 40 min on one core; one property per worker)
	$(TEST_ENV) HYPOTHESIS_EXAMPLES=10000 $(BIN)/pytest -n $(TEST_WORKERS) --maxprocesses 4 --dist load tests/integration/test_billing_properties.py $(PYTEST_ARGS)

# Each tier is a folder of tests/ and a marker (tests/conftest.py): `make test PYTEST_ARGS="-m 'unit or runtime'"`
# runs several tiers by marker.
test-unit: install ## Pure unit tests: no database, no process, seconds
	$(PYTEST) tests/unit $(PYTEST_ARGS)

test-integration: install services ## PostgreSQL + Redis + a real Celery worker, the job's life end to end
	$(TEST_ENV) $(PYTEST) tests/integration tests/security $(PYTEST_ARGS)

test-runtime: install ## Real torch.distributed processes over gloo
	$(TEST_ENV) $(PYTEST) tests/runtime $(PYTEST_ARGS)

test-e2e: install services ## The portal in a real browser (Chromium)
	$(TEST_ENV) $(PYTEST) tests/e2e $(PYTEST_ARGS)

test-security: install services ## The route matrix alone: every route against every role (PostgreSQL)
	$(TEST_ENV) $(PYTEST) tests/security $(PYTEST_ARGS)

vendor: ## Copy the npm assets the portal serves (uPlot) into frontend/static/vendor
	npm ci --no-audit --no-fund --loglevel=error
	cp node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css node_modules/uplot/LICENSE frontend/static/vendor/uplot/

lint: install ## ruff, mypy, import boundaries, no missing migration, the committed OpenAPI schema is current (no server)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/lint-imports --no-logo
	env -u DATABASE_URL $(BIN)/python manage.py makemigrations --check --dry-run
	@mkdir -p var
	env -u DATABASE_URL $(BIN)/python manage.py spectacular --validate --fail-on-warn --file var/openapi.check.yaml
	@diff -q controlplane/openapi.yaml var/openapi.check.yaml >/dev/null || \
		{ echo "controlplane/openapi.yaml is not what the API now says: run make openapi and commit it"; exit 1; }

openapi: install ## Write the API's OpenAPI schema to controlplane/openapi.yaml (commit it: API changes show in review)
	env -u DATABASE_URL $(BIN)/python manage.py spectacular --validate --fail-on-warn --file controlplane/openapi.yaml

fmt: install ## Format and fix what ruff can
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install ## Run the benchmarks (quick mode); each prints a JSON line of figures
	$(BIN)/python bench/skeleton.py --quick

clean: down ## Remove the embedded database, broker folder, runs and logs
	rm -rf var
