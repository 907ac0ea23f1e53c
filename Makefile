# Every target bootstraps .venv itself: a fresh clone needs only python3 (3.11+).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench chaos clean venv

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[console,dev,gpu]"
	@# the test harness (tests, bench, tools, test workers) is importable in the venv but not part of the wheel
	@echo "$(CURDIR)/harness" > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/celeryops_harness.pth"
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/celeryops demo

lint: $(STAMP)
	$(BIN)/ruff check tui tests bench tools harness
	$(BIN)/mypy
	$(BIN)/lint-imports

test: $(STAMP)
	@bash tools/ensure-test-services.sh
	$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest -q -n 6 --durations=15

bench: $(STAMP)
	@bash tools/ensure-test-services.sh
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

chaos: $(STAMP)
	@bash tools/ensure-test-services.sh
	$(BIN)/python tools/chaos.py $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) dist build .pytest_cache .mypy_cache .ruff_cache
