# The project's commands. `make test` and `make demo` work as the first command on a fresh
# Debian 12 / Ubuntu machine (root or sudo): tools/bootstrap.sh installs what is missing.
SHELL := /bin/bash
VENV := .venv
PYTHON := $(VENV)/bin/python
# `make test GATES="ruff-check pytest" PYTEST_ARGS="-k smoke"` runs a subset.
GATES ?=
PYTEST_ARGS ?=

.PHONY: test check demo demo-stop bench stress lint lock clean

# The summary's wall time counts from here, the bootstrap included.
test:
	@export HPCSTACK_MAKE_STARTED=$$(date +%s) HPCSTACK_MAKE_TARGET="make test"; tools/bootstrap.sh test && $(PYTHON) tools/gates.py $(GATES) -- $(PYTEST_ARGS)

# The inner loop: the fast gates and the unit tests (docs/development.md); make test is the whole.
check:
	@export HPCSTACK_MAKE_STARTED=$$(date +%s) HPCSTACK_MAKE_TARGET="make check"; tools/bootstrap.sh test && $(PYTHON) tools/gates.py --check -- $(PYTEST_ARGS)

lint:
	@tools/bootstrap.sh test
	@$(PYTHON) tools/gates.py shellcheck ruff-check ruff-format compile changelog ansible-sanity ansible-lint

demo:
	@tools/bootstrap.sh demo
	@$(PYTHON) testbed/demo.py

# The demo leaves its single-node Slurm running for the how-tos (docs/howto/).
demo-stop:
	@$(PYTHON) testbed/demo.py stop

# The fleet benchmark starts namespace clusters (sshd, the wheelhouse): the test profile.
bench:
	@tools/bootstrap.sh test
	@$(PYTHON) benchmarks/run.py

# The racing tests with many more attempts than `make test` gives them (1,000 each).
stress:
	@tools/bootstrap.sh test
	@HPCSTACK_RACE_ATTEMPTS=1000 $(PYTHON) -m pytest -q -rP -p no:cacheprovider -p xdist -n auto tests/integration/staged/test_staged_races.py tests/integration/ansible/test_arch_guard_role_attacks.py

# Re-resolve requirements/dev.txt from the direct pins in requirements/dev.in.
lock:
	@tools/lock.sh

# The demo's Slurm goes with the tree it serves.
clean:
	@if [ -x $(PYTHON) ]; then $(PYTHON) testbed/demo.py stop; fi
	rm -rf demo tests/output .pytest_cache .ruff_cache .hypothesis
