# make demo / make test: each creates .venv on first use and reuses it afterwards. Generated assets go
# to the same cache folder as `texstream demo` run by hand: $TEXSTREAM_CACHE, else ~/.cache/texstream.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# An editable install finds `texstream` through setuptools' finder, which Python asks only after its
# path finder: a folder named texstream (a clone) in the working folder or beside a script would be
# imported in its place as an empty namespace package. This line, run at start-up from a .pth file
# after setuptools' own, moves that finder first, so `texstream` is always this checkout's engine/
# (new modules still import at once, as with any editable install; tests/test_shadow.py runs it).
EDITABLE_FIRST := import sys; ts_finders = [m for m in sys.meta_path if getattr(m, "__module__", "").startswith("__editable___texstream_")]; [sys.meta_path.remove(m) or sys.meta_path.insert(0, m) for m in ts_finders]; del ts_finders

.PHONY: demo test bench lint docs clean fuzz fuzz-native

# `make fuzz`: total seconds of coverage-guided fuzzing, split evenly over the targets in tests/fuzz.
FUZZ_SECONDS ?= 600

# The fuzz extra (atheris) is installed too: `make test` includes a short fuzz run of every parser of
# outside bytes (tests/fuzz).
$(STAMP): pyproject.toml setup.py engine/native/_native.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,dev,bench,cluster,docs,demos,testing,fuzz]'
	$(PY) -c 'import sys, sysconfig, pathlib; pathlib.Path(sysconfig.get_paths()["purelib"], "texstream-editable-first.pth").write_text(sys.argv[1] + "\n")' '$(EDITABLE_FIRST)'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/texstream demo

test: $(STAMP)
	$(PY) -m pytest -q --timeout=900 tests

# Long fuzz run: every target for FUZZ_SECONDS in all, coverage and crashes summarized per target (crash
# inputs are saved under tests/fuzz/crashes/<target>/, where the tests replay them), then the compiled
# helper under ASan+UBSan on the seed corpus and every saved crash.
fuzz: $(STAMP)
	$(PY) -m tests.fuzz.run all --seconds $(FUZZ_SECONDS)
	$(PY) -m tests.fuzz.native_asan .cache/native-asan

fuzz-native: $(STAMP)
	$(PY) -m tests.fuzz.native_asan .cache/native-asan

bench: $(STAMP)
	$(VENV)/bin/texstream bench

docs: $(STAMP)
	$(PY) -m mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check engine tests demos
	$(VENV)/bin/ruff format --check engine tests demos

clean:
	rm -rf $(VENV) .cache build site *.egg-info
