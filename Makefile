# Materializer — `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
JARS := jvm/lib/.resolved
# The jvm/ modules `make jars` resolves; an image leaves out the tests' registry and capture.
JVM_MODULES ?= spark,kafka,registry,s3,s3proxy,live,localfs,debezium
PYTEST_ARGS ?=
# Test files spread over this many workers, each with its own broker, Redis and Spark.
TEST_WORKERS ?= 2
# The container image: named as the Helm chart deploys it by default (its appVersion).
IMAGE ?= materializer:$(shell sed -nE 's/^appVersion: "?([^"]*)"?$$/\1/p' helm/materializer/Chart.yaml)
IMAGE_TOOL ?= podman

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[dev]'
	touch $@

venv: $(VENV)/.installed ## create .venv and install the package with its dev extra

$(JARS): jvm/pom.xml $(wildcard jvm/*/pom.xml) $(shell find jvm/live/src jvm/localfs/src jvm/debezium/src -name '*.java' -o -name '*.properties')
	@command -v mvn >/dev/null || { echo "Maven (mvn) is needed to resolve the JVM jars: install it (Debian: apt-get install maven)"; exit 1; }
	rm -rf jvm/lib
	mvn -q -B -s jvm/settings.xml -f jvm/pom.xml -pl $(JVM_MODULES) -am package
	touch $@

jars: $(JARS) ## resolve Spark's Kafka/Delta/Avro jars, Kafka's broker, the tests' schema registry and Debezium capture into jvm/lib

java: ## check that Java 17 or newer is the default java
	@command -v java >/dev/null || { echo "Java 17 is needed (Debian: apt-get install openjdk-17-jre-headless)"; exit 1; }
	@v=$$(java -version 2>&1 | sed -nE 's/.*version "([0-9]+).*/\1/p' | head -1); \
	  if [ "$${v:-0}" -lt 17 ]; then echo "Java 17 or newer is needed, found $$v"; exit 1; fi

redis: ## make sure redis-server is installed (apt-get as root)
	@if ! command -v redis-server >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	  else echo "redis-server is missing: install it (sudo apt-get install redis-server) or set REDIS_URL to a running server"; exit 1; fi; \
	fi

postgres: ## make sure PostgreSQL (initdb, postgres, psql) is installed, for the Debezium tests (apt-get as root)
	@if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; \
	  else echo "PostgreSQL is missing: install it (sudo apt-get install postgresql) or set POSTGRES_URL to a server with wal_level=logical"; exit 1; fi; \
	fi

browser: ## make sure Debian's chromium and its chromedriver are installed, for the browser tests (apt-get as root)
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	  else echo "chromium and chromedriver are missing: install them (sudo apt-get install chromium chromium-driver) or set MATERIALIZER_CHROMIUM and MATERIALIZER_CHROMEDRIVER to a matching pair"; exit 1; fi; \
	fi

NODE_CLIENT := tests/interop/node_modules/.package-lock.json

$(NODE_CLIENT): tests/interop/package.json tests/interop/package-lock.json
	@command -v npm >/dev/null || { echo "Node.js and npm are needed for the interop test (Debian: apt-get install nodejs npm)"; exit 1; }
	cd tests/interop && npm ci --no-audit --no-fund --loglevel=error

node: $(NODE_CLIENT) ## install the Node gRPC client used by the interop test

archive: venv jars java redis ## the driver JVM's class data archive: faster starts (skipped when up to date)
	$(BIN)/materializer jvm-archive

setup: venv jars java redis postgres browser node archive ## everything the tests and the demo need

proto: venv ## regenerate the gRPC Python code from proto/
	$(BIN)/python -m tools.codegen

lint: venv ## ruff, mypy and the import rules between packages (import-linter)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: venv ## apply ruff's formatting and fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

docs: venv ## build the documentation site into site/ (strict: a broken link fails)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: setup lint docs ## set up, lint, build the docs, and run every test against real services
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

image-tools: ## make sure podman, buildah, runc and mmdebstrap are installed, for the image (apt-get as root)
	@if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v mmdebstrap >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah runc mmdebstrap; \
	  else echo "podman, runc and mmdebstrap are missing: install them (sudo apt-get install podman buildah runc mmdebstrap)"; exit 1; fi; \
	fi

image: ## build the container image $(IMAGE) (IMAGE_BASE=python|debian|auto, IMAGE_TOOL=podman|docker)
	IMAGE=$(IMAGE) IMAGE_TOOL=$(IMAGE_TOOL) image/build.sh

image-name: ## print the name of the image `make image` builds, which the chart deploys by default
	@echo $(IMAGE)

image-test: setup image ## start the image's containers against the tests' broker and Redis
	IMAGE=$(IMAGE) $(BIN)/pytest tests/image -p no:cacheprovider $(PYTEST_ARGS)

bench: setup ## run the benchmarks (JSON lines on stdout)
	$(BIN)/python bench/pipeline.py
	$(BIN)/python bench/live.py
	$(BIN)/python bench/bulk_run.py
	$(BIN)/python bench/first_minute.py
	$(BIN)/python bench/isolation.py
	$(BIN)/python bench/runtime_maps.py
	$(BIN)/python bench/worker_group.py
	$(BIN)/python bench/query.py
	$(BIN)/python bench/sql.py
	$(BIN)/python bench/console.py
	$(BIN)/python bench/rehydrate.py
	$(BIN)/python bench/enrich.py
	$(BIN)/python bench/redis_cluster.py
	$(BIN)/python bench/delta_merge.py
	$(BIN)/python bench/index_reads.py
	$(BIN)/python bench/index_freshness.py
	$(BIN)/python bench/restore_lookups.py
	$(BIN)/python bench/cdc_fold.py
	$(BIN)/python bench/schema_moves.py

clean: ## remove the venv, resolved jars and local data
	rm -rf $(VENV) jvm/lib warehouse checkpoints site tests/interop/node_modules

.PHONY: help venv jars java redis postgres browser node archive setup proto lint format docs test image-tools image image-name image-test bench clean
