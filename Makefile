# make demo / make test: each creates .venv on first use and reuses it afterwards.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint docs clean

$(STAMP): pyproject.toml setup.py engine/native/_native.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,dev,bench,cluster,docs,demos]'
	touch $(STAMP)

demo: $(STAMP)
	TEXSTREAM_CACHE=$(CURDIR)/.cache $(VENV)/bin/texstream demo

test: $(STAMP)
	$(PY) -m pytest -q --timeout=900 tests

bench: $(STAMP)
	TEXSTREAM_CACHE=$(CURDIR)/.cache $(VENV)/bin/texstream bench

docs: $(STAMP)
	$(PY) -m mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check engine tests demos

clean:
	rm -rf $(VENV) .cache build site *.egg-info
