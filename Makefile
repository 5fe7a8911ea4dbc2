# The two commands a new user needs: `make run` and `make test`. Both build the venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv run test test-fast bench lint clean deploy-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: venv
	$(BIN)/hookbus run

test: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The inner loop: everything but the slow fault and chaos tests.
test-fast: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" $(PYTEST_ARGS)

bench: venv
	$(BIN)/python -m tests.bench

lint: venv
	$(BIN)/ruff check hookbus/__init__.py bus skills services tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV)

# The image and the compose stack on a real Docker engine (root; minutes; not part of `test`).
deploy-check: venv
	$(BIN)/python -m tests.deploy.check

