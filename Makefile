# Developer entry points. Everything runs from a local virtualenv in .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=

export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv test demo bench unasync docs docs-build reference clean

venv: $(VENV)/.installed

# Stamp file: reinstall only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test,plots,docs]'
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

# The documentation site: served with live reload on http://127.0.0.1:8000, or built into site/.
docs: venv
	$(VENV)/bin/mkdocs serve

docs-build: venv
	$(VENV)/bin/mkdocs build --strict

# The generated reference pages (docs/reference/); tests/test_docs_reference.py checks they are current.
reference: venv
	$(PY) scripts/docs_reference.py

clean:
	rm -rf $(VENV) site build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
