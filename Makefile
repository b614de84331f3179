# make demo / make test: each creates .venv on first use and reuses it afterwards. Generated assets go
# to the same cache folder as `texstream demo` run by hand: $TEXSTREAM_CACHE, else ~/.cache/texstream.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint docs clean

$(STAMP): pyproject.toml setup.py engine/native/_native.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,dev,bench,cluster,docs,demos,testing]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/texstream demo

test: $(STAMP)
	$(PY) -m pytest -q --timeout=900 tests

bench: $(STAMP)
	$(VENV)/bin/texstream bench

docs: $(STAMP)
	$(PY) -m mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check engine tests demos
	$(VENV)/bin/ruff format --check engine tests demos

clean:
	rm -rf $(VENV) .cache build site *.egg-info
