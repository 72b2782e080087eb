# The verbs people type: make test, make demo, make bench, make lint.
#
# The environment lives in .venv/ at the repository root. On a machine where torch is
# already importable (a GPU box with its own CUDA build), the venv sees that Python's packages
# and fp8mla's src/ through a .pth file (which also works when that Python is itself a venv)
# and keeps that torch; otherwise it gets the pinned CPU wheel (never a CUDA build) and Triton,
# whose interpreter runs the kernels on the CPU.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fp8mla-installed
TORCH_PIN := torch==2.13.0
TRITON_PIN := triton==3.9.0
PIP := $(PY) -m pip install -q --disable-pip-version-check
# Pinned SGLang/vLLM (no dependencies) for tests/integrations, apart from the venv's packages.
ENGINES := $(VENV)/engines
ENGINES_STAMP := $(ENGINES)/.installed
# The engine matrix's further legs, one folder each where pins conflict with $(ENGINES) (vLLM
# 0.34 pins tokenizers>=0.23.3, SGLang 0.5.23 tokenizers==0.23.2): `make test` runs the vLLM
# tests again against each (`make test ENGINE_LEGS=` skips them).
ENGINES_VLLM034 := $(VENV)/engines-vllm-0.34
ENGINE_LEGS ?= $(ENGINES_VLLM034)
ENGINE_LEG_TESTS := tests/integrations/test_engines_installed.py \
  tests/integrations/test_vllm_plugin.py tests/integrations/test_vllm_graph.py \
  tests/integrations/test_vllm_sparse.py
# The GPU machine's Triton (the H200 runs 3.6): `make test` also compiles every SM90 build
# with it, so that a kernel its compiler rejects fails here rather than on the GPU (spills
# and shared memory are judged with $(TRITON_PIN)). `make test TRITON_GPU=` skips it.
TRITON_GPU_PIN := triton==3.6.0
TRITON_GPU ?= $(VENV)/triton-3.6

# Triton kernels run compiled on a CUDA GPU, interpreted everywhere else.
HAS_CUDA := $(shell python3 -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 && echo 1 || echo 0)
ifeq ($(HAS_CUDA),0)
export TRITON_INTERPRET ?= 1
endif

.PHONY: test demo bench lint info clean engines

$(STAMP): pyproject.toml Makefile
	@if python3 -c "import torch" >/dev/null 2>&1; then \
	  echo "fp8mla: keeping the torch already installed ($$(python3 -c 'import torch; print(torch.__version__)'))"; \
	  echo "fp8mla: creating $(VENV)/ on top of it"; \
	  python3 -m venv $(VENV) && \
	  { python3 -c 'import site; print("\n".join(site.getsitepackages()))'; echo "$(CURDIR)/src"; } \
	    > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_host_site.pth" && \
	  { $(PY) -c "import pytest, hypothesis" 2>/dev/null || \
	    { echo "fp8mla: installing the test tools (pytest, hypothesis)"; \
	      $(PIP) --retries 0 --timeout 15 pytest hypothesis; }; } && \
	  { $(PY) -c "import ruff" 2>/dev/null || \
	    { echo "fp8mla: installing ruff (make lint)"; \
	      $(PIP) --retries 0 --timeout 15 ruff || echo "fp8mla: ruff not installed (offline)"; }; }; \
	else \
	  echo "fp8mla: no torch here: creating $(VENV)/ with the CPU build of $(TORCH_PIN) (about a minute)"; \
	  python3 -m venv $(VENV) && \
	  echo "fp8mla: installing $(TORCH_PIN) (CPU)" && \
	  $(PIP) $(TORCH_PIN) && \
	  echo "fp8mla: installing $(TRITON_PIN) (its interpreter runs the kernels on the CPU), fp8mla and its test tools" && \
	  $(PIP) $(TRITON_PIN) -e ".[dev]"; \
	fi
	@echo "fp8mla: $(VENV)/ is ready (make clean removes it)"
	@touch $@

# Skips itself (leaving an UNREACHABLE note) only when the package registry cannot be reached.
$(ENGINES_STAMP): tests/integrations/requirements-engines.txt tests/integrations/install_engines.py | $(STAMP)
	@$(PY) tests/integrations/install_engines.py --target $(ENGINES)

$(ENGINES_VLLM034)/.installed: tests/integrations/requirements-engines-vllm-0.34.txt tests/integrations/install_engines.py | $(STAMP)
	@$(PY) tests/integrations/install_engines.py --target $(ENGINES_VLLM034) \
	  --requirements tests/integrations/requirements-engines-vllm-0.34.txt

engines: $(ENGINES_STAMP) $(ENGINES_VLLM034)/.installed

# Without the package registry the folder gets an UNREACHABLE note and the check skips; any
# other install failure fails the build.
$(TRITON_GPU)/.installed: | $(STAMP)
	@echo "fp8mla: installing $(TRITON_GPU_PIN) into $(TRITON_GPU) (the GPU machine's Triton)"
	@rm -rf $(TRITON_GPU) && mkdir -p $(TRITON_GPU) && \
	if $(PIP) --retries 1 --timeout 30 --no-deps --no-compile --target $(TRITON_GPU) \
	    $(TRITON_GPU_PIN); then touch $@; \
	elif ! $(PY) -m pip index versions triton --retries 0 --timeout 15 >/dev/null 2>&1; then \
	  echo "package registry unreachable: $(TRITON_GPU_PIN) not installed, its SM90 compile check skipped" \
	    | tee $(TRITON_GPU)/UNREACHABLE; touch $@; \
	else exit 1; fi

test: $(STAMP) $(ENGINES_STAMP) $(addsuffix /.installed,$(ENGINE_LEGS)) $(addsuffix /.installed,$(TRITON_GPU))
	$(PY) -m pytest -q $(PYTEST_ARGS)
	@for leg in $(abspath $(ENGINE_LEGS)); do \
	  echo "fp8mla: the vLLM tests against $$leg"; \
	  FP8MLA_ENGINES_PATH=$$leg FP8MLA_ENGINES_ONLY=vllm \
	    $(PY) -m pytest -q $(ENGINE_LEG_TESTS) || exit $$?; \
	done
	@for leg in $(abspath $(TRITON_GPU)); do \
	  if [ -f $$leg/UNREACHABLE ]; then cat $$leg/UNREACHABLE; continue; fi; \
	  echo "fp8mla: the SM90 builds under $(TRITON_GPU_PIN) (the GPU machine's Triton)"; \
	  PYTHONPATH=$$leg $(PY) -m fp8mla.tools.compile_matrix --targets sm90 --quiet \
	    --fail-on compile --write $$leg/sm90.md || exit $$?; \
	done

demo: $(STAMP)
	@echo "fp8mla: running the demo (about a minute on a CPU): $(PY) -m fp8mla demo $(DEMO_ARGS)"
	@$(PY) -m fp8mla demo $(DEMO_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/bench_decode.py $(BENCH_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check src tests benchmarks examples

info: $(STAMP)
	$(PY) -m fp8mla info

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
