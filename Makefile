# Two commands do everything on a fresh machine: `make demo` and `make test`.
# The virtual environment is rebuilt when pyproject.toml or requirements.lock change.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# vLLM's own environment (its CPU build pins torch and transformers): the tests that serve
# mmspec's heads in vLLM and compare them with vLLM's speculators package.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PYTHONWARNINGS := ignore::UserWarning:setuptools

.PHONY: setup demo test bench docs serve clean speech-deps browser-deps vllm-env scene

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip > $(VENV)/pip.log 2>&1 || { grep -v "^WARNING: Location" $(VENV)/pip.log; exit 1; }
	$(PY) -m pip install -q -r requirements.lock > $(VENV)/pip.log 2>&1 || { grep -v "^WARNING: Location" $(VENV)/pip.log; exit 1; }
	flock pyproject.toml $(PY) -m pip install -q --no-deps -e . > $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	$(PY) -c "import mmspec, torch, torchaudio, transformers, diffusers; print('mmspec', mmspec.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__, '| diffusers', diffusers.__version__)"
	touch $(STAMP)

# vLLM's CPU build and speculators, pinned in requirements-vllm.lock; its torchvision,
# torchaudio and torchcodec builds fail to load beside its torch and are removed (nothing
# here uses them). mmspec itself is installed there without its dependencies (editable), so
# vLLM finds its plugin (pyproject.toml's vllm.general_plugins: mmspec's own DraftHead);
# the two environments' editable installs (which write mmspec.egg-info here) take turns.
$(VLLM_STAMP): requirements-vllm.lock pyproject.toml
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q -r requirements-vllm.lock > $(VLLM_VENV)/pip.log 2>&1 || { grep -v "^WARNING: Location" $(VLLM_VENV)/pip.log; exit 1; }
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec > /dev/null 2>&1 || true
	flock pyproject.toml $(VLLM_PY) -m pip install -q --no-deps -e . > $(VLLM_VENV)/pip.log 2>&1 || { cat $(VLLM_VENV)/pip.log; exit 1; }
	$(VLLM_PY) -c "import vllm, speculators.models.eagle3, torch, transformers; from importlib.metadata import entry_points as e; assert 'mmspec_draft_head' in e(group='vllm.general_plugins').names; print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__, '| mmspec plugin')"
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# espeak-ng (Debian package) speaks the reference sentences of the speech tests and demo.
speech-deps:
	@command -v espeak-ng >/dev/null 2>&1 || { \
	  echo "installing espeak-ng (apt-get)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq >/dev/null && $$SUDO apt-get install -y -qq espeak-ng >/dev/null \
	  || { echo "could not install espeak-ng: apt-get install -y espeak-ng"; exit 1; }; }

# Chromium and its driver (Debian packages) for the web demo's browser test; without them the
# test is skipped and says why.
browser-deps:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || { \
	  echo "installing chromium and chromium-driver (apt-get)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq >/dev/null && \
	  $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 \
	  || echo "could not install chromium (the browser test will be skipped)"; }

setup: $(STAMP) speech-deps browser-deps

# THREADS=N: torch's CPU threads (default one per core; on a machine busy with other work,
# `make demo THREADS=1` keeps the demo from oversubscribing the cores).
demo: setup
	$(PY) -m recipes.demo $(if $(THREADS),--threads $(THREADS))

# samples/scene.png (committed), the scene the docs' vision-language examples ask about.
scene: $(STAMP)
	$(PY) samples/make_scene.py

# The tests spread over the cores (pytest-xdist, at most 4 workers; `-n 0` runs them in
# one process). The two environments install side by side.
test:
	$(MAKE) -j2 $(STAMP) $(VLLM_STAMP)
	$(MAKE) setup
	$(PY) -m pytest -n auto --maxprocesses 4

bench: setup
	$(PY) -m eval.bench_core

# The documentation site with the API reference, in site/ (mkdocs.yml).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --quiet -d site

# The web demo on http://127.0.0.1:7860
serve: setup
	$(VENV)/bin/mmspec serve

clean:
	rm -rf $(VENV) $(VLLM_VENV) out site .pytest_cache
