# Corral: `make run` serves the API, `make test` runs every test. Both set the machine up first (idempotent).
.PHONY: bootstrap run start stop test test-unit check bench bench-quick clean-runtime

PY := .venv/bin/python
PYTEST_ARGS ?=

bootstrap:
	@bash scripts/bootstrap.sh

run: bootstrap
	.venv/bin/corral serve --host 127.0.0.1 --port 8000

# The same server in the background (address from CORRAL_URL, pid file and log in the data directory); idempotent.
start: bootstrap
	@bash scripts/server.sh start

stop:
	@bash scripts/server.sh stop

# The whole suite: unit, integration (real Docker, gVisor, PostgreSQL) and e2e (HTTP API against gVisor).
test: bootstrap
	@CORRAL_TEST_POSTGRES_URL="$$(bash scripts/postgres.sh)" .venv/bin/pytest $(PYTEST_ARGS)

test-unit: bootstrap
	.venv/bin/pytest -m unit $(PYTEST_ARGS)

check: bootstrap
	.venv/bin/ruff check src tests $(wildcard bench)
	.venv/bin/ruff format --check src tests $(wildcard bench)
	.venv/bin/mypy

bench: bootstrap
	$(PY) -m bench

bench-quick: bootstrap
	$(PY) -m bench --quick

# Remove every container and volume Corral created on this machine (workspaces included!).
clean-runtime:
	-docker rm -f $$(docker ps -aq --filter label=corral.workspace.id) 2>/dev/null
	-docker volume rm $$(docker volume ls -q --filter label=corral.workspace.id) 2>/dev/null
