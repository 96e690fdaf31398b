# Tollgate's front door. `make start` runs the gateway, `make test` runs everything CI runs.
SHELL := /bin/bash
.DEFAULT_GOAL := help
NPM_STAMP := node_modules/.package-lock.json

.PHONY: help install start gen gen-check lint format typecheck test test-unit test-int up down check helm-lint

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

$(NPM_STAMP): package.json package-lock.json $(wildcard packages/*/package.json services/*/package.json)
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

test-int: install ## integration and end-to-end tests on real NATS and Redis
	npx vitest run --project integration

test: gen-check lint typecheck helm-lint test-unit test-int ## everything CI runs

check: test ## alias of test

helm-lint: ## Helm chart: lint --strict, render and validate offline (kubeconform) every deploy/values and ci values file
	bash deploy/tools/helm-lint.sh

up: install ## start the multi-process stack on local NATS and Redis (two inference-routers)
	npx tsx deploy/local/up.ts

down: ## stop the stack started by `make up`
	npx tsx deploy/local/down.ts

.PHONY: bench
bench: install ## overhead benchmark: direct vs through Tollgate (all-in-one and stack); tables + bench/results/*.json
	npx tsx bench/run.ts
