# Synapse Fleet. `make dev` brings up a local fleet; `make test` runs every test suite.

# Versions of the tools the project builds for itself (from the Go module proxy; nothing else
# is downloaded). The control-plane binaries are cached outside the work tree by hack/envtest.sh.
ENVTEST_K8S_VERSION ?= 1.37.2
CONTROLLER_TOOLS_VERSION ?= v0.23.0
KUSTOMIZE_VERSION ?= v5.8.1
HELM_VERSION ?= v3.22.0
BUF_VERSION ?= v1.75.0
PROTOC_GEN_GO_VERSION ?= v1.36.12
CRD_REF_DOCS_VERSION ?= v0.3.0

LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
KUSTOMIZE ?= $(LOCALBIN)/kustomize-$(KUSTOMIZE_VERSION)
HELM ?= $(LOCALBIN)/helm-$(HELM_VERSION)
BUF ?= $(LOCALBIN)/buf-$(BUF_VERSION)
PROTOC_GEN_GO ?= $(LOCALBIN)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)
CRD_REF_DOCS ?= $(LOCALBIN)/crd-ref-docs-$(CRD_REF_DOCS_VERSION)
# A caller may point envtest at binaries of its own.
KUBEBUILDER_ASSETS ?= $(LOCALBIN)/k8s/$(ENVTEST_K8S_VERSION)
export KUBEBUILDER_ASSETS

GO_TEST_FLAGS ?= -race -count=1
CHART_CRDS := charts/synapse-fleet/crds

SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate the CRDs and RBAC, and copy the CRDs, RBAC rules and node-restriction policies into the chart.
	$(CONTROLLER_GEN) rbac:roleName=synapse-controller crd paths="./api/..." paths="./controllers/..." output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=synapse-agent paths="./node-agent/agent/..." paths="./node-agent/apiauth/..." output:rbac:artifacts:config=config/agent
	rm -f $(CHART_CRDS)/*.yaml && mkdir -p $(CHART_CRDS) && cp config/crd/bases/*.yaml $(CHART_CRDS)/
	cp config/rbac/role.yaml charts/synapse-fleet/files/role.yaml
	cp config/agent/role.yaml charts/synapse-fleet/files/agent-role.yaml
	cp config/policies/node_restriction.yaml charts/synapse-fleet/files/node-restriction.yaml
	cp config/rbac/leader_election_role.yaml charts/synapse-fleet/files/leader-election-role.yaml

.PHONY: generate
generate: controller-gen ## Generate the deepcopy code.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: proto
proto: buf protoc-gen-go ## Generate the worker protocol's Go code from node-agent/protocol.
	cd node-agent/protocol && $(BUF) generate

.PHONY: docs
docs: crd-ref-docs ## Generate the API reference (docs/api-reference.md) from the Go types, with their CEL rules' messages.
	$(CRD_REF_DOCS) --source-path=./api/v1alpha1 --config=hack/crd-ref-docs/config.yaml --renderer=markdown \
		--templates-dir=hack/crd-ref-docs/templates/markdown --output-path=docs/api-reference.md --log-level=WARN

.PHONY: fmt
fmt: ## Run go fmt.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet, here and for darwin/arm64 (the real Neural Engine path).
	go vet ./...
	GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 go vet ./...

.PHONY: test
test: envtest vet docs ## Run every test suite (unit, envtest, e2e) with the race detector, then the load test on its own, and the HTTP benchmark briefly (its answers checked).
	go test $(GO_TEST_FLAGS) ./...
	@# The load test skips itself under -race: its agent is a process of its own, never built
	@# with it, and the test's race-built client would be the bottleneck. It runs here alone,
	@# without -race, so that no other suite moves the machine's CPU under the attack
	@# (test/load/load_test.go says why).
	go test $(filter-out -race -race=true,$(GO_TEST_FLAGS)) ./test/load
	go test -run '^$$' -bench '^BenchmarkEmbeddingsOverHTTP$$' -benchtime 20x ./test/bench

.PHONY: audit
audit: envtest ## Run every test docs/no-silent-fallback.md names (go test -json): fail on any missing, skipped or failed.
	go run ./hack/runaudit --doc docs/no-silent-fallback.md

.PHONY: bench
bench: envtest ## Run the benchmarks (the fleet ones against a local control plane).
	go test -run '^$$' -bench . -benchmem ./...
	go test -run '^$$' -bench LeaseResident -benchmem -cpu 1,2 ./node-agent/supervisor

NODES ?= 1000
LANES ?= 5000

.PHONY: scale
scale: envtest ## Run NODES hollow Macs and LANES lanes (default 1000 and 5000) against the real controller, then three storms; report in bin/scale-report.json.
	@mkdir -p $(LOCALBIN)
	SCALE_NODES=$(NODES) SCALE_LANES=$(LANES) SCALE_REPORT=$(LOCALBIN)/scale-report.json \
		go test -run '^$$' -bench '^BenchmarkHollowFleet$$' -benchtime 1x -timeout 4h ./test/scale

LOAD_DURATION ?= 60s

.PHONY: load
load: envtest ## Drive one agent on the loopback at twice its capacity for LOAD_DURATION (default 60s) with valid, oversize and malformed calls and slow-loris connections; report in bin/load-report.json.
	@mkdir -p $(LOCALBIN)
	LOAD_DURATION=$(LOAD_DURATION) LOAD_REPORT=$(LOCALBIN)/load-report.json go test -count=1 -v -run '^TestAgentUnderLoad$$' -timeout 30m ./test/load

CASE ?= residency-safety
SIM_SCALE ?= 0.001

.PHONY: stress
stress: build ## Run a residency stress case (CASE=residency-safety|cold-throughput|compile-scheduling, SIM_SCALE=1 for seed timings).
	$(LOCALBIN)/synapse-stress --case $(CASE) --sim-scale $(SIM_SCALE) --worker $(LOCALBIN)/synapse-ane-worker --report $(LOCALBIN)/stress-$(CASE).json
	@echo "report: $(LOCALBIN)/stress-$(CASE).json"

SEEDS ?= 10000
FIRST_SEED ?= 1

.PHONY: simulate
simulate: ## Drive the residency core through SEEDS seeded schedules (or for DURATION, e.g. 1h), checking every invariant after every step; SEED=n replays one.
	go test -count=1 -timeout 0 -v -run '^TestSimulation$$' ./node-agent/residency/simulation -args \
		$(if $(SEED),-seed $(SEED) -tracelen 400,$(if $(DURATION),-duration $(DURATION),-seeds $(SEEDS))) -first $(FIRST_SEED)

MUTATE_SEEDS ?= 300

.PHONY: mutate
mutate: ## Plant one bug per residency rule, one at a time (go test -overlay, the tree untouched), and fail unless the simulator or a named test catches each; MUTATE_ARGS=-all runs the named tests against every mutant.
	go run ./hack/mutate -seeds $(MUTATE_SEEDS) $(MUTATE_ARGS)

# FUZZTIME is a duration (10m) or a count of inputs (20000x). CI gives a count: with a duration,
# Go 1.26's fuzz coordinator can report "context deadline exceeded" as a failure when its deadline
# races a worker's last input (golang/go issue 75804, fixed in Go 1.27); a count sets no deadline.
FUZZTIME ?= 10m

.PHONY: fuzz
fuzz: ## Fuzz the frame decoder, the worker's message handling, the host's Execute framing, the manifest parser, the archive unpacker, the MIL validator and the embeddings and rerank requests (the real handler over a real sim worker), FUZZTIME each.
	go test -run '^$$' -fuzz FuzzReadFrame -fuzztime $(FUZZTIME) ./node-agent/protocol
	go test -run '^$$' -fuzz FuzzWorkerServe -fuzztime $(FUZZTIME) ./node-agent/worker
	go test -run '^$$' -fuzz FuzzExecuteFrame -fuzztime $(FUZZTIME) ./node-agent/workerhost
	go test -run '^$$' -fuzz FuzzExecuteReply -fuzztime $(FUZZTIME) ./node-agent/workerhost
	go test -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME) ./node-agent/artifact
	go test -run '^$$' -fuzz FuzzUnpack -fuzztime $(FUZZTIME) ./node-agent/artifact
	go test -run '^$$' -fuzz FuzzValidate -fuzztime $(FUZZTIME) ./node-agent/mil
	go test -run '^$$' -fuzz FuzzEmbeddingsRequest -fuzztime $(FUZZTIME) ./node-agent/httpapi
	go test -run '^$$' -fuzz FuzzRerankRequest -fuzztime $(FUZZTIME) ./node-agent/httpapi

GENERATED_PATHS := api config charts node-agent/protocol docs/api-reference.md

.PHONY: verify
verify: manifests generate proto docs kustomize ## Regenerate everything (the API reference too), fail if a committed file is stale, build the kustomizations.
	@if ! git diff --quiet -- $(GENERATED_PATHS) || [ -n "$$(git ls-files --others --exclude-standard -- $(GENERATED_PATHS))" ]; then \
		echo "generated files are stale; run 'make manifests generate proto' and commit:"; \
		git --no-pager diff --stat -- $(GENERATED_PATHS); git ls-files --others --exclude-standard -- $(GENERATED_PATHS); exit 1; fi
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt would change:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	@for k in config/default config/policies config/samples config/prometheus; do $(KUSTOMIZE) build $$k >/dev/null || { echo "kustomize build $$k failed"; exit 1; }; done

.PHONY: helm-lint
helm-lint: helm ## Lint and render the Helm chart; fail if it grants other rights than config/default (which make dev and the e2e suite run under).
	$(HELM) lint --strict --kube-version $(ENVTEST_K8S_VERSION) charts/synapse-fleet
	$(HELM) template synapse-fleet charts/synapse-fleet --kube-version $(ENVTEST_K8S_VERSION) >/dev/null
	$(HELM) template synapse-fleet charts/synapse-fleet --kube-version $(ENVTEST_K8S_VERSION) \
		--set monitoring.dashboards.enabled=true,monitoring.prometheusRules.enabled=true,metrics.serviceMonitor.enabled=true >/dev/null
	$(HELM) template synapse-fleet charts/synapse-fleet --namespace synapse-system --kube-version $(ENVTEST_K8S_VERSION) | go run ./hack/chartrbac --config config/default -

##@ Build

.PHONY: build
build: ## Build the binaries into bin/.
	go build -o $(LOCALBIN)/synapse-controller .
	go build -o $(LOCALBIN)/ ./node-agent/cmd/...
	go build -o $(LOCALBIN)/ ./kubectl-synapse/cmd/...

.PHONY: run
run: ## Run the controller against the cluster of the current kubeconfig.
	go run . --leader-elect=false

.PHONY: dev
dev: envtest build ## Start a local fleet: control plane, controller, three simulated Macs, the samples (Ctrl-C stops).
	go run ./hack/devfleet --assets $(KUBEBUILDER_ASSETS) --bin $(LOCALBIN) --config config --samples config/samples --write-kubeconfig $(LOCALBIN)/dev.kubeconfig

.PHONY: goldens
goldens: ## Rewrite the golden MIL programs and weight blobs of node-agent/mil and node-agent/family from the emitter (review the diff).
	go test -count=1 -run Golden ./node-agent/mil ./node-agent/family -update

.PHONY: ane-smoke
ane-smoke: ## On a Mac with Apple silicon: the Neural Engine diagnostic ladder (environment, one layer, binding, each operation, full layers, aned's cache and the kept folders, how many programs the device holds); report in bin/ane-smoke-report.json, written after every check and kept if the ladder dies. CHECKPOINT=dir runs stage 5 on that checkpoint.
	@if [ "$$(uname -s)/$$(uname -m)" != "Darwin/arm64" ]; then echo "ane-smoke runs on macOS on Apple silicon only (this is $$(uname -s)/$$(uname -m))" >&2; exit 2; fi
	go build -o $(LOCALBIN)/synapse-ane-smoke ./hack/anesmoke
	codesign -f -s - -i synapse-ane-smoke $(LOCALBIN)/synapse-ane-smoke
	env -u TMPDIR $(LOCALBIN)/synapse-ane-smoke --report $(LOCALBIN)/ane-smoke-report.json $(if $(CHECKPOINT),--checkpoint $(CHECKPOINT))

.PHONY: ane-smoke-daemon
ane-smoke-daemon: ## On a Mac: the same ladder as a LaunchDaemon with UserName (a headless Mac's domain; uses sudo); report in bin/ane-smoke-daemon-report.json.
	@if [ "$$(uname -s)/$$(uname -m)" != "Darwin/arm64" ]; then echo "ane-smoke-daemon runs on macOS on Apple silicon only (this is $$(uname -s)/$$(uname -m))" >&2; exit 2; fi
	go build -o $(LOCALBIN)/synapse-ane-smoke ./hack/anesmoke
	codesign -f -s - -i synapse-ane-smoke $(LOCALBIN)/synapse-ane-smoke
	hack/anesmoke/daemon.sh $(LOCALBIN)/synapse-ane-smoke $(LOCALBIN)/ane-smoke-daemon-report.json

##@ Tools

.PHONY: envtest
envtest: ## Build (once, then cached) kube-apiserver, etcd and kubectl for envtest.
	@if [ "$(KUBEBUILDER_ASSETS)" = "$(LOCALBIN)/k8s/$(ENVTEST_K8S_VERSION)" ]; then hack/envtest.sh $(ENVTEST_K8S_VERSION) $(LOCALBIN)/k8s >/dev/null; fi

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN)
$(CONTROLLER_GEN):
	$(call go-install-tool,$(CONTROLLER_GEN),sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION),controller-gen)

.PHONY: kustomize
kustomize: $(KUSTOMIZE)
$(KUSTOMIZE):
	$(call go-install-tool,$(KUSTOMIZE),sigs.k8s.io/kustomize/kustomize/v5,$(KUSTOMIZE_VERSION),kustomize)

.PHONY: buf
buf: $(BUF)
$(BUF):
	$(call go-install-tool,$(BUF),github.com/bufbuild/buf/cmd/buf,$(BUF_VERSION),buf)

.PHONY: protoc-gen-go
protoc-gen-go: $(PROTOC_GEN_GO)
$(PROTOC_GEN_GO):
	$(call go-install-tool,$(PROTOC_GEN_GO),google.golang.org/protobuf/cmd/protoc-gen-go,$(PROTOC_GEN_GO_VERSION),protoc-gen-go)

.PHONY: crd-ref-docs
crd-ref-docs: $(CRD_REF_DOCS)
$(CRD_REF_DOCS):
	$(call go-install-tool,$(CRD_REF_DOCS),github.com/elastic/crd-ref-docs,$(CRD_REF_DOCS_VERSION),crd-ref-docs)

.PHONY: helm
helm: $(HELM)
$(HELM):
	$(call go-install-tool,$(HELM),helm.sh/helm/v3/cmd/helm,$(HELM_VERSION),helm)

# go-install-tool builds package $(2) at version $(3), whose binary is named $(4), into $(1).
define go-install-tool
@[ -f "$(1)" ] || { \
set -e; \
echo "building $(2)@$(3)"; \
rm -f "$(1)"; \
GOBIN="$(LOCALBIN)" go install "$(2)@$(3)"; \
mv "$(LOCALBIN)/$(4)" "$(1)"; \
}
endef
