# carve: a Kubernetes DRA driver. `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
GO ?= go
BIN := bin
CLUSTER_DIR ?= /tmp/carve-cluster
export CARVE_CLUSTER_DIR := $(CLUSTER_DIR)
# A count of executions, not a duration: with a duration, Go before 1.27 can
# fail a target with "context deadline exceeded" when -fuzztime expires while
# a worker is mid-call (golang/go#75804; seen here on go1.26.8, no input
# written). 5000 executions a target on top of its seed corpus: 110 s for the
# 21 targets here, builds included (20000x took 220 s), most of it each
# target's instrumented build; the seeds run in make unit as well. The long
# runs are a developer's (below).
FUZZTIME ?= 5000x
# Fixture trees are tens of thousands of small files; on tmpfs, as real sysfs
# is in memory, they are built ten times faster than on ext4.
export TMPDIR ?= $(shell [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm || echo /tmp)
BENCHTIME ?= 1s
# go-nvml is cgo (it dlopens libnvidia-ml.so.1 at run time, so the binary
# runs on hosts without it); its header's deprecation warnings are noise.
export CGO_ENABLED := 1
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
# golangci-lint at a pinned version, built by go run (cached after the first
# build); .golangci.yml configures it for both modules. It type-checks the
# cgo packages, so it runs with the CGO settings above.
GOLANGCI_LINT ?= $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

.PHONY: help build release test unit shares fuzz e2e multinode-e2e soak verify generate manifests bench demo demo-down cluster-up cluster-down scheduler scheduler-e2e scheduler-perf vmtest gpu-acceptance-pack clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# The build tags of bin/carve (cmd/carve/buildtags says why); the e2e
# harness and cmd/carve's tests build it with the same.
CARVE_TAGS := $(shell grep -v '^#' cmd/carve/buildtags)

build: ## build bin/carve, the static bin/carve-hook and bin/carve-scheduler
	$(GO) build -tags '$(CARVE_TAGS)' -o $(BIN)/carve ./cmd/carve
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(BIN)/carve-hook ./cmd/carve-hook
	$(MAKE) -C scheduler build

# The release is the chart's appVersion: the binary's version (cmd/carve/
# version.go), the chart's and the image tag's (TestVersionsAgree); its
# entry is in deploy/CHANGELOG.md.
VERSION := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' deploy/chart/carve/Chart.yaml)
RELEASE_DIR := $(BIN)/release

release: ## build what a release ships into bin/release: the binaries, the agent's image archive and the packaged chart, all of VERSION
	@rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)
	$(GO) build -tags '$(CARVE_TAGS)' -ldflags "-X main.commit=$$(git rev-parse HEAD)$$(git diff --quiet HEAD || echo -modified) -X main.buildDate=$$(date -u +%Y-%m-%dT%H:%M:%SZ)" -o $(BIN)/carve ./cmd/carve
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(BIN)/carve-hook ./cmd/carve-hook
	$(MAKE) -C scheduler build
	@got=$$($(BIN)/carve version); case "$$got" in "carve v$(VERSION),"*) ;; *) echo "bin/carve says '$$got', the chart $(VERSION)" >&2; exit 1 ;; esac
	cp $(BIN)/carve $(BIN)/carve-hook $(BIN)/carve-scheduler $(RELEASE_DIR)/
	deploy/images/agent.sh carve:$(VERSION) --out $(RELEASE_DIR)/carve_$(VERSION).oci.tar | tail -n1
	$$(deploy/cluster/build-tools.sh | tail -n1)/helm package deploy/chart/carve -d $(RELEASE_DIR)
	cd $(RELEASE_DIR) && sha256sum * > SHA256SUMS && cat SHA256SUMS

test: build unit fuzz scheduler scheduler-e2e shares e2e ## everything: unit tests, a short fuzz run, the scheduler module and its integration test, a hundred saturated shares, and the tests against a real control plane

# As root, CARVE_NET_REQUIRED=1: the bpf/ and netdev/ tests fail, rather than
# skip, where they cannot get root, bpffs or a network namespace (they still
# skip where the kernel lacks a qdisc, link kind or BPF feature).
unit: ## unit tests (as root they use real netns, veth and BPF, and must)
	@if [ "$$(id -u)" = 0 ]; then export CARVE_NET_REQUIRED=1; fi; \
	echo "CARVE_NET_REQUIRED=$${CARVE_NET_REQUIRED:-} $(GO) test -count=1 ./..."; \
	$(GO) test -count=1 ./...

# A hundred 10M shares of one parent in test namespaces, saturated at once
# by a TCP flow each, 10 s each way, alone on the machine, after the same
# hundred shares of the design before flow isolation (plain HTB classes) as
# the reference of the same run. 100 shares are this machine kind's knee,
# where how many stay within 1% is the machine's speed (one CI machine read
# every share 0.855-0.895, evenly), so the bar is the cost and the evenness
# that the regression of issue 37 broke (3.3 times the plain design's CPU,
# shares 0.52-0.96 of their rate): fails where carve's CPU per shaped
# Gbit/s is over 1.5 times the plain design's, its mean goodput/limit under
# 0.85 of the plain design's, or Jain's index under 0.99, either way. make
# soak holds every share within 1%. Prints the table: N, within, min, max,
# mean, Jain, CPU idle, CPU per shaped Gbit/s.
shares: ## a hundred 10M shares saturated at once, 10 s each way, against plain HTB in the same run: fails at over 1.5x its CPU per Gbit, under 0.85 of its goodput, or Jain < 0.99 (make soak: all within 1%)
	@if [ "$$(id -u)" = 0 ]; then export CARVE_NET_REQUIRED=1; fi; \
	CARVE_MANY_SHARES=100 CARVE_MANY_SHARES_COMPARE=1 CARVE_MANY_SHARES_WITHIN=0 $(GO) test -count=1 -v -run '^TestManySharesHoldTheirRates$$' ./netdev/

# Each fuzz target runs FUZZTIME executions on top of its committed seed corpus
# (f.Add and testdata/fuzz/<Target>/): the parsers of the node's sysfs and
# config, and every input that crosses a trust boundary (a claim's opaque
# config, the hook's OCI state, argv and attach spec, the checkpoint and the
# reaper's queue, /proc/<pid>/{cgroup,stat}, the MPS pid file, the claim
# status merge). A failing input is written to testdata/fuzz/<Target>/;
# commit it with the fix.
#
# Ten minutes a target: not FUZZTIME=10m, which is unreliable on go1.26 (a
# duration can fail a target with "context deadline exceeded" and no input
# written, golang/go#75804, above), but a count. Rates differ fifty-fold
# between targets; measured here (2 shared cores, loaded) they ran from about
# 1,000 a second (FuzzCheckpointRead, FuzzPodOf: a file written and read each
# time) to 40,000 (proccgroup's FuzzParse), most 3,000 to 15,000. So
#   make fuzz FUZZTIME=2000000x
# is about ten minutes for a typical target (from one minute for FuzzParse to
# half an hour for the slowest; some three hours in all), and one target
# alone, with its count for ten minutes here:
#   go test -run '^$' -fuzz '^FuzzPodOf$' -fuzztime 600000x ./gpu/police
# FuzzCheckpointRead, FuzzPodOf 600000x; FuzzDecodeEffectiveConfig,
# FuzzReaperQueue 1000000x; FuzzStartTime, FuzzPID, FuzzMergeDeviceStatus,
# FuzzEffectiveConfig, FuzzStartTimeComm 2000000x; FuzzReadAttachSpec,
# FuzzMain 3000000x; FuzzContainerPID, the sysfs and node config targets
# 5000000x; v1alpha1's FuzzDecode 9000000x; FuzzParse 25000000x.
fuzz: ## short fuzz run of every fuzz target (FUZZTIME=<count>x; ten minutes a target: see the Makefile)
	@# The targets are found in the sources: go test -list would build every
	@# package's tests again to list them (86 s here).
	@for dir in $$(grep -rl --include='*_test.go' --exclude-dir=scheduler --exclude-dir=testdata '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
	  for f in $$(grep -h '^func Fuzz' $$dir/*_test.go | sed 's/^func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
	    echo "fuzz $$dir $$f"; \
	    out=$$($(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$dir 2>&1) || { echo "$$out"; exit 1; }; \
	  done; \
	done

scheduler: ## test the scheduler module
	cd scheduler && $(GO) test -count=1 ./...

# Its own control plane without kubelets (scheduler/hack/cluster.sh: /tmp/carve-sched,
# ports 53790/53800/56443/50257/50259), so it can run beside the default cluster.
scheduler-e2e: ## the scheduler's integration test: stock vs carve-scheduler choices on a control plane
	$(MAKE) -C scheduler e2e

# Upstream's scheduler_perf harness (no kubelets, its own etcd and API server
# per run); PERF_NODES, PERF_REPEAT, PERF_RUN and PERF_OUT pass through.
scheduler-perf: ## scheduler_perf DRA workloads, stock vs carve's plugins: a markdown table of pods/s and placement
	$(MAKE) -C scheduler perf

# e2e brings up the local control plane unless CARVE_KUBECONFIG points at one,
# and always takes down what it brought up. With the local cluster, and
# MULTINODE=1 (the default), the cross-node tests (multinode-e2e, below)
# run at the same time on a 3-node cluster of their own: the single node's
# tests leave the machine's cores idle 78% of the time, so both take about
# as long as the single node's alone (deploy/README.md, "CI's budget").
# The multi-node cluster starts once the single node is up (each cluster's
# teardown removes only the host paths that were absent at its start), and
# its output is printed when both are done.
MULTINODE ?= 1
e2e: ## tests against a real kube-apiserver (starts and stops the local cluster, and the 3-node one beside it: MULTINODE=0 skips that)
	@export CARVE_HELM=$$(deploy/cluster/build-tools.sh | tail -n1)/helm; \
	if [ -n "$${CARVE_KUBECONFIG:-}" ]; then \
	  CARVE_E2E_REQUIRED=1 $(GO) test -count=1 -v -timeout 30m ./deploy/e2e/...; \
	else \
	  mn=; mnlog=$$(mktemp); \
	  trap 'if [ -n "$$mn" ]; then wait $$mn || true; fi; rm -f $$mnlog; deploy/cluster/down.sh' EXIT; \
	  kubeconfig=$$(deploy/cluster/up.sh | tail -n1); \
	  if [ "$(MULTINODE)" = 1 ]; then \
	    echo "multinode-e2e: started beside the single node's tests (its output follows them)"; \
	    $(MAKE) --no-print-directory -o build multinode-e2e >$$mnlog 2>&1 & mn=$$!; \
	  fi; \
	  rc=0; \
	  CARVE_KUBECONFIG=$$kubeconfig CARVE_E2E_REQUIRED=1 CARVE_E2E_NODE_REQUIRED=1 CARVE_E2E_SOAK_KILLS=$(SOAK_KILLS_SHORT) $(GO) test -count=1 -v -timeout 30m ./deploy/e2e/... || rc=1; \
	  echo "guard: the real-node e2e again, with the agent blind to this host's L3 (an LLC from a fixture)"; \
	  CARVE_KUBECONFIG=$$kubeconfig CARVE_E2E_LLC=fixture CARVE_E2E_REQUIRED=1 CARVE_E2E_NODE_REQUIRED=1 $(GO) test -count=1 -v -timeout 10m -run '^TestNodeEndToEnd$$' ./deploy/e2e/ || rc=1; \
	  if [ -n "$$mn" ]; then \
	    mnrc=0; wait $$mn || mnrc=$$?; mn=; \
	    echo "=== multinode-e2e (run beside the tests above; exit $$mnrc)"; cat $$mnlog; \
	    [ $$mnrc = 0 ] || rc=1; \
	  fi; \
	  exit $$rc; \
	fi

# The cross-node tests (deploy/e2e/multinode_*) on a cluster of 3 nodes made
# of namespaces (deploy/cluster/nodes.sh), in a state dir and on ports of
# their own, so they run beside the single-node cluster: shares on every
# node, 100 pods with pool addresses at once, who reaches whom by macvlan
# mode and segment (netdev/ISOLATION.md), a tenant attacking another node's
# over the segment, the agent's rolling upgrade,
# then, last, a node killed. About 6 minutes here, warm; make e2e (and so
# make test) runs it beside the single node's tests.
MULTINODE_DIR ?= /tmp/carve-mn
multinode-e2e: build ## the cross-node tests on a local cluster of 3 nodes (started and stopped here)
	@export CARVE_HELM=$$(deploy/cluster/build-tools.sh | tail -n1)/helm CARVE_CLUSTER_DIR=$(MULTINODE_DIR) \
	  CARVE_ETCD_PORT=24790 CARVE_ETCD_PEER_PORT=24800 CARVE_APISERVER_PORT=27443 \
	  CARVE_CONTROLLER_MANAGER_PORT=21257 CARVE_SCHEDULER_PORT=21259; \
	trap 'deploy/cluster/down.sh' EXIT; \
	kubeconfig=$$(CARVE_CLUSTER_NODES=3 deploy/cluster/up.sh | tail -n1); \
	export CARVE_KUBECONFIG=$$kubeconfig CARVE_E2E_MULTINODE_REQUIRED=1; \
	$(GO) test -count=1 -v -timeout 20m -run '^TestMultiNode(Cluster|Shares|PoolAddresses|Isolation|CrossNodeAttacks|Rollout)$$' ./deploy/e2e/; \
	CARVE_E2E_MULTINODE_KILL=1 $(GO) test -count=1 -v -timeout 10m -run '^TestMultiNodeKilledNode$$' ./deploy/e2e/

# The soak runs on the local cluster's real node: the agent SIGKILLed
# SOAK_KILLS times (and the kubelet restarted) while share pods come and go,
# then SOAK_PODS share pods at once, for each count, the 100 also saturating
# their shares both ways; before the cluster, netdev's hundred shares of
# 10M saturated at once in test namespaces; after the kills, three shares of
# 45M, 130M and 730M saturated at once OVERRATE_RUNS times each way, none
# ever over its rate; then 20 borrowing pods switching on and off for 60 s,
# and the node's own traffic beside a borrowing pod.
# make test runs SOAK_KILLS_SHORT kills of the first, and one run of the
# three shares.
SOAK_KILLS ?= 100
SOAK_KILLS_SHORT ?= 3
OVERRATE_RUNS ?= 20
SOAK_PODS ?= 20 100 250
soak: build ## the long soak on the real node: agent kills under churn, then 20, 100 and 250 share pods at once
	@if [ "$$(id -u)" = 0 ]; then export CARVE_NET_REQUIRED=1; fi; \
	CARVE_MANY_SHARES=100 CARVE_MANY_SHARES_COMPARE=1 CARVE_BORROW_SOAK=1 $(GO) test -count=1 -v -run '^(TestManySharesHoldTheirRates|TestBorrowingSharesOnAndOff)$$' ./netdev/
	@export CARVE_HELM=$$(deploy/cluster/build-tools.sh | tail -n1)/helm; \
	trap 'deploy/cluster/down.sh' EXIT; \
	kubeconfig=$$(deploy/cluster/up.sh | tail -n1); \
	export CARVE_KUBECONFIG=$$kubeconfig CARVE_E2E_REQUIRED=1 CARVE_E2E_NODE_REQUIRED=1; \
	CARVE_E2E_SOAK_KILLS=$(SOAK_KILLS) $(GO) test -count=1 -v -timeout 60m -run '^TestNodeAgentKillSoak$$' ./deploy/e2e/ || exit 1; \
	CARVE_E2E_OVERRATE_RUNS=$(OVERRATE_RUNS) $(GO) test -count=1 -v -timeout 30m -run '^TestNodeSharesNeverOverTheirRate$$' ./deploy/e2e/ || exit 1; \
	CARVE_E2E_BORROW_ONOFF=1 $(GO) test -count=1 -v -timeout 10m -run '^(TestNodeBorrowingSharesOnAndOff|TestNodeUnsharedTrafficKeepsTheFloors)$$' ./deploy/e2e/ || exit 1; \
	for n in $(SOAK_PODS); do \
	  traffic=0; [ "$$n" = 100 ] && traffic=1; \
	  CARVE_E2E_SHARE_PODS=$$n CARVE_E2E_SHARE_PODS_TRAFFIC=$$traffic $(GO) test -count=1 -v -timeout 30m -run '^TestNodeManySharePods$$' ./deploy/e2e/ || exit 1; \
	done

# The privileged packages in throw-away qemu guests (TCG: this machine kind
# cannot use KVM), one a package and kernel, of Debian's current kernels:
# VMTEST_KERNELS (suites; trixie's 6.12 and bookworm's 6.1 by default),
# VMTEST_PKGS, VMTEST_RUN (a -run regexp). deploy/vmtest/README.md says what
# runs where and what each kernel lacks.
vmtest: ## the datapath tests in qemu guests of other kernels (VMTEST_KERNELS, VMTEST_PKGS, VMTEST_RUN)
	@GO=$(GO) deploy/vmtest/vmtest.sh

# The GPU acceptance for a lent machine's call (64 MiB carried, 10 minutes):
# the stripped, gzipped binaries and the scripts in gpu/acceptance/pack/;
# there, `cd gpu/acceptance/pack && OUT=$$OUT ./run.sh device` runs every
# part in 7 minutes (gpu/acceptance/doc.go).
gpu-acceptance-pack: ## the GPU acceptance run packed for a lent GPU machine (gpu/acceptance/pack/, at most 64 MiB)
	gpu/acceptance/run.sh pack

manifests: ## render the chart into deploy/manifests/carve.yaml
	@helm=$$(deploy/cluster/build-tools.sh | tail -n1)/helm; \
	$$helm lint --kube-version 1.37.0 deploy/chart/carve >/dev/null && \
	$$helm template carve deploy/chart/carve --namespace carve-system --kube-version 1.37.0 --set createNamespace=true > deploy/manifests/carve.yaml

# NODES=N (N >= 2): the control plane on the host and N nodes, each a set of
# namespaces of its own on a node network and a shared tenant segment
# (deploy/cluster/nodes.sh); NODES=1, the default, is the single node.
NODES ?= 1

cluster-up: ## start the local control plane and NODES nodes (default 1); the last line is the kubeconfig path
	@CARVE_CLUSTER_NODES=$(NODES) deploy/cluster/up.sh

cluster-down: ## stop the local control plane and remove its state
	@deploy/cluster/down.sh

verify: ## gofmt, vet, golangci-lint, the import layering, go mod tidy diff, generated-code diff
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt needed: $$out"; exit 1; }
	$(GO) vet ./...
	cd scheduler && $(GO) vet ./...
	$(GOLANGCI_LINT) run --show-stats=false ./...
	cd scheduler && $(GOLANGCI_LINT) run --config ../.golangci.yml --show-stats=false ./...
	$(GO) run ./deploy/importcheck
	@for d in . scheduler; do \
	  (cd $$d && cp go.mod /tmp/carve-go.mod.bak && cp go.sum /tmp/carve-go.sum.bak && $(GO) mod tidy && \
	   if ! diff -q go.mod /tmp/carve-go.mod.bak >/dev/null || ! diff -q go.sum /tmp/carve-go.sum.bak >/dev/null; then \
	     echo "go mod tidy changes $$d/go.mod or go.sum"; cp /tmp/carve-go.mod.bak go.mod; cp /tmp/carve-go.sum.bak go.sum; exit 1; fi); \
	done
	@$(MAKE) -s generate
	@if [ -n "$$(git status --porcelain)" ]; then git status --short; echo "generated code is stale or the tree is dirty: run make generate and commit"; exit 1; fi

generate: ## regenerate generated code (go generate: bpf2go)
	$(GO) generate ./...

# The prepare benchmarks need an API server (every prepare reads its claims)
# and the pod-start benchmark the real node: the local cluster is started for
# them, unless CARVE_KUBECONFIG points at one.
bench: build ## benchmarks, printed as a table
	@export CARVE_HELM=$$(deploy/cluster/build-tools.sh | tail -n1)/helm; \
	if [ -z "$${CARVE_KUBECONFIG:-}" ]; then \
	  trap 'deploy/cluster/down.sh >/dev/null' EXIT; \
	  export CARVE_KUBECONFIG=$$(deploy/cluster/up.sh | tail -n1); \
	fi; \
	$(GO) test -tags '$(CARVE_TAGS)' -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./... | tee /dev/stderr | deploy/bench-table.sh

demo: build ## bring up the local cluster (NODES nodes), install carve with its chart, run pods with claims
	@CARVE_CLUSTER_NODES=$(NODES) deploy/demo.sh

demo-down: ## tear the demo down: its pods (unprepared), the cluster, its node, the demo's veth, the agent's links and BPF pins
	@deploy/demo-down.sh

clean:
	rm -rf $(BIN)
