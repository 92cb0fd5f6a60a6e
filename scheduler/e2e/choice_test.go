package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/carve-dra/carve/scheduler/pkg/fixture"
)

// carveProfile is the profile deploy/ ships (chart defaults).
const carveProfile = `  plugins:
    multiPoint:
      enabled:
      - name: ShareFit
        weight: 3
      - name: Topology
        weight: 3
`

func nicSpec(bw string) resourceapi.ResourceClaimSpec {
	return fixture.ShareSpec("nic", map[resourceapi.QualifiedName]string{fixture.Egress: bw, fixture.Ingress: bw})
}

func gpuSpec(mem string) resourceapi.ResourceClaimSpec {
	return fixture.ShareSpec("gpu", map[resourceapi.QualifiedName]string{fixture.Memory: mem})
}

// binaries returns the stock kube-scheduler (CARVE_STOCK_SCHEDULER, else the
// one deploy/cluster/build-binaries.sh caches) and carve-scheduler
// (CARVE_SCHEDULER_BIN, else built from this module).
func binaries(t *testing.T) (stock, carve string) {
	t.Helper()
	stock = os.Getenv("CARVE_STOCK_SCHEDULER")
	if stock == "" {
		out, err := exec.Command("../../deploy/cluster/build-binaries.sh", "kube-scheduler").Output()
		if err != nil {
			t.Fatalf("build-binaries.sh: %v", err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		stock = filepath.Join(lines[len(lines)-1], "kube-scheduler")
	}
	carve = os.Getenv("CARVE_SCHEDULER_BIN")
	if carve == "" {
		carve = filepath.Join(t.TempDir(), "carve-scheduler")
		if out, err := exec.Command("go", "build", "-o", carve, "../cmd/carve-scheduler").CombinedOutput(); err != nil {
			t.Fatalf("build carve-scheduler: %v\n%s", err, out)
		}
	}
	return stock, carve
}

// Twin nodes per scheduler and scenario; in each, one node already runs an
// occupant pod asking for CPU, so the stock scheduler's LeastAllocated
// scoring steers away from it. carve-scheduler must choose differently
// exactly where ShareFit or Topology prefers the other node:
//
//   - pack: the occupied node's first NIC holds a 60G share. A 20G share
//     fills it to 80% there against 20% on the empty twin: carve packs onto
//     the occupied node, stock spreads to the empty one.
//   - align: the occupied node's first GPU is full, so a GPU share would go
//     to the second GPU while the NIC share stays on the first NIC, under
//     another PCIe root; on the twin (with a heavier occupant, holding no
//     shares) both land under one root. Fill is the same on both: Topology
//     decides for the twin, stock for the lighter node.
//   - same: neither node holds shares. ShareFit and Topology see no
//     difference, so carve agrees with stock.
func TestChoicesDifferWherePolicySays(t *testing.T) {
	e := setup(t)
	stockBin, carveBin := binaries(t)
	e.scheduler(t, stockBin, "e2e-stock", 50271, "")
	e.scheduler(t, carveBin, "e2e-carve", 50272, carveProfile)
	sets := map[string]string{"stock": "e2e-stock", "carve": "e2e-carve"}

	for set := range sets {
		a := e.node(t, "pack-a-"+set, "pack", set)
		e.node(t, "pack-b-"+set, "pack", set)
		e.occupy(t, a, "1", map[string]resourceapi.ResourceClaimSpec{"nic-0000-19-00-0": nicSpec("60G")})

		split := e.node(t, "align-split-"+set, "align", set)
		fit := e.node(t, "align-fit-"+set, "align", set)
		e.occupy(t, split, "1", map[string]resourceapi.ResourceClaimSpec{"gpu-0000-18-00-0": gpuSpec("80Gi")})
		e.occupy(t, fit, "2", nil)

		sa := e.node(t, "same-a-"+set, "same", set)
		e.node(t, "same-b-"+set, "same", set)
		e.occupy(t, sa, "1", nil)
	}

	for _, tc := range []struct {
		scenario    string
		claims      map[string]resourceapi.ResourceClaimSpec
		stock, want string
	}{
		{"pack", map[string]resourceapi.ResourceClaimSpec{"net": nicSpec("20G")}, "pack-b", "pack-a"},
		{"align", map[string]resourceapi.ResourceClaimSpec{"gpu": gpuSpec("10Gi"), "net": nicSpec("10G")}, "align-split", "align-fit"},
		{"same", map[string]resourceapi.ResourceClaimSpec{"net": nicSpec("10G")}, "same-b", "same-b"},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			gotStock := e.pod(t, sets["stock"], tc.scenario, "stock", tc.claims)
			gotCarve := e.pod(t, sets["carve"], tc.scenario, "carve", tc.claims)
			if gotStock != tc.stock+"-stock" {
				t.Errorf("stock chose %s, want %s-stock (the scenario's premise)", gotStock, tc.stock)
			}
			if gotCarve != tc.want+"-carve" {
				t.Errorf("carve-scheduler chose %s, want %s-carve", gotCarve, tc.want)
			}
		})
	}
}
