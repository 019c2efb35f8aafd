# Two commands for a fresh machine (see README):
#   make demo   install, then run notebooks/quickstart.ipynb headless -> build/quickstart.html
#   make test   install (with Debian's chromium for the browser tests, prometheus for promtool
#               and the Prometheus tests, faketime for the two-node test, jupyter-collaboration
#               for the real-time collaboration test: make system-deps), then
#               the lint (ruff and the import contracts) and the test suite
#   make wheel  the wheel the README installs: $(DIST)/gpuprof_jupyter-0.1.0-py3-none-any.whl
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
DIST ?= dist

.PHONY: install browser promtool faketime hub-deps collab-deps system-deps demo test test-fast lint bench labextension wheel

$(VENV)/.installed: pyproject.toml labextension/package.json labextension/yarn.lock $(wildcard labextension/src/*.ts labextension/style/*)
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch pinned first: the CPU build on local disk (a bare `torch` pulls a multi-GB CUDA build)
	$(PY) -m pip install --quiet torch==2.13.0
	# also builds labextension/ with this machine's Node (jlpm install && jlpm build, via hatch-jupyter-builder)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $@

install: $(VENV)/.installed

browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@chromium --version

# Debian's prometheus package: promtool (the alert rules' checks and unit tests) and the server
# the Prometheus source's tests start themselves. Installed without starting its service.
promtool:
	@command -v promtool >/dev/null 2>&1 || scripts/apt_install.sh prometheus
	@promtool --version 2>&1 | head -n 1

# Debian's faketime: the two-node torchrun test sets one node's clock 2.5 s ahead with it
# (tests/test_jobs.py; skipped, saying so, without it).
faketime:
	@command -v faketime >/dev/null 2>&1 || scripts/apt_install.sh faketime

# JupyterHub's real test (tests/test_jupyterhub.py): the hub from pip (the hub extra), its proxy from npm.
$(VENV)/.hub: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[hub]'
	touch $@

hub-deps: $(VENV)/.hub
	@command -v configurable-http-proxy >/dev/null 2>&1 || npm install -g --silent configurable-http-proxy
	@configurable-http-proxy --version

# Real-time collaboration's browser test (tests/test_browser_collaboration.py): jupyter-collaboration
# and its parts, pinned in the collab extra, into a folder of their own (--target, --no-deps: the
# rest is in the venv) that only that test's JupyterLab puts on its paths.
$(VENV)/collab/.installed: $(VENV)/.installed pyproject.toml
	rm -rf $(VENV)/collab
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/collab $$($(PY) -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['collab']))")
	touch $@

collab-deps: $(VENV)/collab/.installed

system-deps: browser promtool faketime hub-deps collab-deps

demo: install
	rm -rf build && mkdir -p build
	cp notebooks/quickstart.ipynb build/quickstart.ipynb
	cd build && ../$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace quickstart.ipynb
	cd build && ../$(VENV)/bin/jupyter nbconvert --to html quickstart.ipynb --output quickstart.html
	@echo
	@echo "make demo: done. Outputs:"
	@echo "  executed notebook  build/quickstart.ipynb  (open it in JupyterLab)"
	@echo "  its HTML           build/quickstart.html"
	@echo "  report             build/report.html       (standalone, opens offline)"
	@echo "  winning settings   build/pipeline.yaml"
	@echo "  experiments        build/.gpuprof/         (gpuprof list --store build/.gpuprof)"

# The tests keep their compiled (and pytest's assertion-rewritten) modules in __pycache__/ (ignored
# by git) even where the environment sets PYTHONDONTWRITEBYTECODE: without them every run compiles
# the test suite and the package again (3-4 s of CPU of the 10-11 s before the fast run's first test).
KEEP_BYTECODE := PYTHONDONTWRITEBYTECODE=

test: install system-deps lint
	$(KEEP_BYTECODE) $(PY) -m pytest -q -ra $(PYTEST_ARGS)

# What a developer runs after an edit: no kernel, browser, subprocess or server (under a minute on 2
# cores). The modules of kernel, browser and process tests are not even imported (tests/conftest.py);
# each test file runs whole on one of the two workers (--dist loadfile: a module's shared fixtures
# are built once); property tests try a quarter of their examples (tests/property_budget.py).
test-fast: install lint
	$(KEEP_BYTECODE) GPUPROF_QUICK_PROPERTIES=1 $(PY) -m pytest -q -ra -n 2 --dist loadfile \
		-m "not kernel and not browser and not process" $(PYTEST_ARGS)

# ruff, then the import contracts ([tool.importlinter] in pyproject.toml) on this checkout's package,
# in this process tree, not from pytest: so test-fast and test check the layers too (under a second)
lint: install
	$(PY) -m ruff check gpuprof_jupyter tests benchmarks scripts
	PYTHONPATH=$(CURDIR) $(VENV)/bin/lint-imports --no-cache

labextension: install
	VENV=$(VENV) scripts/build_labextension.sh
	$(PY) -m pip install --quiet --no-deps -e .

# The front end is built with Node once (make install does, through the hatch hook), then `build`
# packs it without build isolation: hatchling, hatch-jupyter-builder and build come with the test
# extra, so nothing is downloaded. tests/test_labextension_wheel.py runs this target.
wheel: install
	@test -f gpuprof_jupyter/labextension/static/style.js || VENV=$(VENV) scripts/build_labextension.sh
	$(PY) -m build --wheel --no-isolation --outdir $(DIST) .
	@ls $(DIST)/gpuprof_jupyter-*.whl

bench: install
	$(PY) -m benchmarks $(BENCH_ARGS)
