# Two commands a new user needs: `make train` and `make test` (`make test-all`: every test, as CI runs them).
# All create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: train test test-all install clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned, so pip takes the CPU wheel instead of the multi-GB CUDA build
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(PY) recipes/acer.py $(ARGS)

# the markers (pyproject.toml) of what `make test` leaves to `make test-all`
FAST := not slow and not integration and not gpu and not slurm

test: $(STAMP)
	$(PY) -m pytest -m "$(FAST)" $(PYTEST_ARGS)

test-all: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs
