# The two commands a newcomer types: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: venv demo demo-quick study study-quick test test-all warmup bench clean

# torch goes first: a plain `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/regroup demo

demo-quick: $(STAMP)
	$(BIN)/regroup demo --quick

study: $(STAMP)
	$(BIN)/regroup study

study-quick: $(STAMP)
	$(BIN)/regroup study --quick

warmup: $(STAMP)
	$(BIN)/regroup warmup --out runs/warmup

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

test-all: $(STAMP)
	$(BIN)/python -m pytest -q tests

bench: $(STAMP)
	$(BIN)/python benchmarks/vs_trl.py

clean:
	rm -rf runs .pytest_cache
