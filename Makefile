# Developer entry points. Everything runs from a local virtualenv in .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=

export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv test demo bench unasync clean

venv: $(VENV)/.installed

# Stamp file: reinstall only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test,plots]'
	touch $@

test: venv
	$(PY) -m pytest $(PYTEST_ARGS)

demo: venv
	$(PY) -m admission.tools.demo

bench: venv
	$(PY) -m admission.tools.bench

# The sync client (and script calls) from their asyncio source; tests/test_unasync.py checks them.
unasync:
	$(PYTHON) scripts/unasync.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
