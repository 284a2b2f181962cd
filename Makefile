# Set-up on a fresh machine: `make demo` or `make test`; both create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install bench bench-quick clean browser speech

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch first and pinned: the CPU build on local disk; a bare `torch` could fetch a CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/ecotrain fit recipes/mnist1d_cnn.yaml --run-dir runs/demo --overwrite
	$(BIN)/ecotrain report runs/demo

# The report's browser tests drive Debian's chromium + chromium-driver (a downloaded browser cannot be fetched).
browser:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
	  echo "make: installing chromium and chromium-driver (apt-get) for the report's browser tests"; \
	  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1 || \
	  { echo "make: chromium and chromium-driver are missing and could not be installed; run as root: apt-get install -y chromium chromium-driver"; exit 1; }; \
	fi

# The speech example and its tests render audio with Debian's espeak-ng (docs/speech.md).
speech:
	@if ! command -v espeak-ng >/dev/null 2>&1; then \
	  echo "make: installing espeak-ng (apt-get) for the speech example and its tests"; \
	  (apt-get update -qq && apt-get install -y -qq espeak-ng) >/dev/null 2>&1 || \
	  { echo "make: espeak-ng is missing and could not be installed; run as root: apt-get install -y espeak-ng"; exit 1; }; \
	fi

# Two pytest workers (pytest-xdist), one test file at a time each: the tests are single-threaded
# (torch at one thread), so 2 cores run the suite in ~8 min instead of ~15. TEST_WORKERS=0: serial.
TEST_WORKERS ?= 2
test: $(STAMP) browser speech
	$(BIN)/python -m pytest tests -m "not bench" --durations=15 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# Every bench program in its --quick mode (tests/integration/test_bench_quick.py, the `bench` tier): ~10 min
# of CPU, so not in `make test`; CI runs it after the tests. The programs spread over both workers.
bench-quick: $(STAMP) speech
	$(BIN)/python -m pytest tests/integration/test_bench_quick.py -m bench -n 2 --dist load

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

bench: $(STAMP)
	$(BIN)/python bench/overhead.py

clean:
	rm -rf $(VENV) runs

# Mutation testing of the modules that carry the promises (checkpoints, objective, task, compare, the
# gate, replay, EWC, BatchNorm): mutmut mutates each one and runs only its own unit tests against every
# mutant, in a scratch copy under build/mutants/ (the module -> tests mapping is in tests/mutants.py).
# Installed here, not in the test extra: mutmut brings textual and libcst. Some modules only:
# `make mutants MUTANTS="gate ewc"`; MUTANT_JOBS=1 for one worker (default 2). Ends with one table
# (score = killed / (mutants - equivalents), the total and the minimum) and build/mutants/summary.json.
.PHONY: mutants
MUTANTS ?=
$(BIN)/mutmut: $(STAMP)
	$(BIN)/pip install -q mutmut==3.8.1

mutants: $(BIN)/mutmut
	$(BIN)/python tests/mutants.py $(MUTANTS)
