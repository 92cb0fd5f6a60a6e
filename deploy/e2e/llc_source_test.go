package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
)

// fixtureLLCID is the id of the L3 the fixture describes. No host this runs
// on numbers its caches this high, so a published llc-97 can only have come
// from the fixture, and the host's own llc-N shows the agent was not blind.
const fixtureLLCID = 97

// llcSource says where the node's agent reads its CPU caches in a real-node
// test, chosen by CARVE_E2E_LLC:
//   - "host": the host's own sysfs; fails where the host has no L3;
//   - "fixture": a fixture tree with one L3 (the agent is blind to the
//     host's caches), so the test does not depend on this CPU;
//   - empty (the default): the host's L3 where it has one, else the fixture.
//
// cacheRoot is the host path to give the chart as cpuCacheRoot ("" for the
// host's own), device the LLC device the node then publishes, and hostLLCs
// the device names of the host's own caches.
type llcSource struct {
	mode      string
	cacheRoot string
	device    string
	hostLLCs  []string
}

func chooseLLCSource(t testing.TB, clusterDir string) llcSource {
	t.Helper()
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: "/"})
	if err != nil {
		t.Fatalf("discover this host's caches: %v", err)
	}
	src := llcSource{mode: os.Getenv("CARVE_E2E_LLC")}
	for _, l := range inv.LLCs {
		src.hostLLCs = append(src.hostLLCs, fmt.Sprintf("llc-%d", l.ID))
	}
	if src.mode == "" {
		src.mode = "fixture"
		if len(inv.LLCs) > 0 {
			src.mode = "host"
		}
	}
	switch src.mode {
	case "host":
		if len(inv.LLCs) == 0 {
			t.Fatal("CARVE_E2E_LLC=host, but this host's sysfs has no L3 (no cpu*/cache/index*/level 3)")
		}
		src.device = src.hostLLCs[0]
	case "fixture":
		// Under the cluster's directory on the host's root filesystem,
		// which the agent sees under its /host mount.
		dir, err := os.MkdirTemp(clusterDir, "llc-fixture-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		cpus := make([]int, runtime.NumCPU())
		for i := range cpus {
			cpus[i] = i
		}
		sysfstest.New(dir).AddLLC(sysfstest.LLC{ID: fixtureLLCID, CPUs: cpus, Size: "16M", Ways: 16})
		src.cacheRoot, src.device = dir, fmt.Sprintf("llc-%d", fixtureLLCID)
	default:
		t.Fatalf("CARVE_E2E_LLC=%q: want host, fixture or empty", src.mode)
	}
	t.Logf("LLC under test: %s from %s (the host's own: %v)", src.device, src.mode, src.hostLLCs)
	return src
}

// helmValues are the chart values that point the agent at the source.
func (s llcSource) helmValues() []string {
	if s.cacheRoot == "" {
		return nil
	}
	return []string{"--set-string", "cpuCacheRoot=" + filepath.Clean(s.cacheRoot)}
}
