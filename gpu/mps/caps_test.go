package mps

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/carve-dra/carve/gpu/gputest"
)

// capSets reads a process's (or task's) capability sets from its status
// file, by their names there (CapInh, CapPrm, CapEff, CapBnd, CapAmb).
func capSets(t *testing.T, status string) map[string]uint64 {
	t.Helper()
	b, err := os.ReadFile(status)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || !strings.HasPrefix(k, "Cap") {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			t.Fatalf("%s: %q", status, l)
		}
		out[k] = n
	}
	return out
}

// The daemon (and what it forks: the fake's stand-in, as the real one's
// servers) keeps only the allowed capabilities, started from this
// process's namespace or the host's; the agent's own threads keep all of
// theirs. "all" keeps the agent's.
func TestDaemonKeepsOnlyItsCapabilities(t *testing.T) {
	gputest.NeedRoot(t)
	ctx := context.Background()
	keep, err := ParseCapabilities(DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	agent := capSets(t, "/proc/self/status")
	fake, err := filepath.Abs(filepath.Join("testdata", Binary))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		caps    Capabilities
		starter Starter
		want    uint64
	}{
		{"this namespace", keep, nil, keep.mask() & agent["CapBnd"]},
		{"the host's namespace", keep, StartInNamespace("/proc/self/ns/mnt", "/"), keep.mask() & agent["CapBnd"]},
		{"all", nil, nil, agent["CapBnd"]},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, _ := fakeDaemon(t)
			d.Path, d.Start, d.Capabilities = fake, c.starter, c.caps
			if _, err := d.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = d.Stop(ctx) }()
			pid, _ := d.PID()
			got := capSets(t, fmt.Sprintf("/proc/%d/status", pid))
			for _, set := range []string{"CapBnd", "CapPrm", "CapEff"} {
				if got[set] != c.want {
					t.Errorf("the daemon's %s = %#x, want %#x", set, got[set], c.want)
				}
			}
			if got["CapInh"]&^c.want != 0 || got["CapAmb"] != 0 {
				t.Errorf("the daemon's inheritable %#x, ambient %#x: more than %#x", got["CapInh"], got["CapAmb"], c.want)
			}
			tasks, _ := filepath.Glob("/proc/self/task/*/status")
			for _, task := range tasks {
				if s := capSets(t, task); s["CapBnd"] != agent["CapBnd"] || s["CapEff"] != agent["CapEff"] {
					t.Errorf("agent thread %s: bounding %#x, effective %#x after the start, want %#x, %#x", task, s["CapBnd"], s["CapEff"], agent["CapBnd"], agent["CapEff"])
				}
			}
		})
	}
}

func TestParseCapabilities(t *testing.T) {
	got, err := ParseCapabilities([]string{"setuid", "CAP_SETGID", " kill "})
	if err != nil || len(got) != 3 || got.mask() != 1<<6|1<<7|1<<5 {
		t.Fatalf("ParseCapabilities = %v, %v", got, err)
	}
	if got, err := ParseCapabilities([]string{"all"}); err != nil || got != nil {
		t.Fatalf(`"all" = %v, %v; want nil (keep all)`, got, err)
	}
	if _, err := ParseCapabilities([]string{"CAP_SETUID", "CAP_NOPE"}); err == nil || !strings.Contains(err.Error(), `"CAP_NOPE"`) {
		t.Fatalf("an unknown capability: %v", err)
	}
	for _, name := range DefaultCapabilities {
		if _, ok := capNumbers[name]; !ok {
			t.Errorf("default capability %s unknown", name)
		}
	}
}
