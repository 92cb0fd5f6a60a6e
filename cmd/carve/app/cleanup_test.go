package app

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/checkpoint"
)

// cleanupFixture is a node's carve files in temporary directories, and a
// network namespace standing for the node's.
func cleanupFixture(t *testing.T) CleanupOptions {
	t.Helper()
	tp := nettest.New(t)
	dir := t.TempDir()
	o := CleanupOptions{DriverName: "carve.dev", Root: "/", HostNetns: tp.Path("node"),
		StateDir: filepath.Join(dir, "state"), CDIDir: filepath.Join(dir, "cdi"),
		RegistrarDir: filepath.Join(dir, "plugins_registry"), PluginsDir: filepath.Join(dir, "plugins")}
	for _, d := range []string{o.StateDir, o.CDIDir, o.RegistrarDir, filepath.Join(o.PluginsDir, "carve.dev")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for path, data := range map[string]string{
		filepath.Join(o.CDIDir, "carve.dev-claim_1234.json"):          "{}",
		filepath.Join(o.CDIDir, ".carve.dev-claim_5678.json.tmp-99"):  "{}",
		filepath.Join(o.CDIDir, "nvidia.com-gpu.json"):                "{}",
		filepath.Join(o.StateDir, "carve-hook"):                       "binary",
		filepath.Join(o.RegistrarDir, "carve.dev-abc-reg.sock"):       "",
		filepath.Join(o.RegistrarDir, "gpu.example.com-abc-reg.sock"): "",
	} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return o
}

func writeRecords(t *testing.T, stateDir string, records ...prepare.ClaimRecord) {
	t.Helper()
	bootID, err := checkpoint.ReadBootID("/")
	if err != nil {
		t.Fatal(err)
	}
	cp, err := prepare.OpenCheckpoint(stateDir, bootID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.Update(func(r *prepare.Records) error {
		for _, c := range records {
			r.Set(c.UID, c)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// With claims prepared a cleanup refuses, naming them, and changes
// nothing; with none it removes the driver's files only; a second run finds
// nothing.
func TestCleanupNode(t *testing.T) {
	ctx := context.Background()
	o := cleanupFixture(t)
	writeRecords(t, o.StateDir, prepare.ClaimRecord{UID: "u1", Namespace: "team-a", Name: "net-a", State: prepare.ClaimCompleted})
	removed, err := CleanupNode(ctx, o)
	if !errors.Is(err, ErrClaimsPrepared) || !strings.Contains(err.Error(), "team-a/net-a") || len(removed) != 0 {
		t.Fatalf("with a claim prepared: %v, %v; want a refusal naming team-a/net-a, nothing removed", removed, err)
	}
	for _, p := range []string{checkpoint.Path(o.StateDir), filepath.Join(o.CDIDir, "carve.dev-claim_1234.json")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("a refused cleanup removed %s", p)
		}
	}

	bootID, _ := checkpoint.ReadBootID("/")
	cp, _ := prepare.OpenCheckpoint(o.StateDir, bootID, nil)
	if err := cp.Update(func(r *prepare.Records) error { r.Delete("u1"); return nil }); err != nil {
		t.Fatal(err)
	}
	removed, err = CleanupNode(ctx, o)
	if err != nil {
		t.Fatalf("no claims: %v (removed %v)", err, removed)
	}
	t.Logf("removed: %v", removed)
	gone := []string{filepath.Join(o.CDIDir, "carve.dev-claim_1234.json"), filepath.Join(o.CDIDir, ".carve.dev-claim_5678.json.tmp-99"),
		filepath.Join(o.StateDir, "carve-hook"), checkpoint.Path(o.StateDir), filepath.Join(o.PluginsDir, "carve.dev"),
		filepath.Join(o.RegistrarDir, "carve.dev-abc-reg.sock")}
	for _, p := range gone {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s is still there", p)
		}
	}
	for _, p := range []string{filepath.Join(o.CDIDir, "nvidia.com-gpu.json"), filepath.Join(o.RegistrarDir, "gpu.example.com-abc-reg.sock")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("another driver's %s was removed", p)
		}
	}
	if again, err := CleanupNode(ctx, o); err != nil || len(again) != 0 {
		t.Errorf("again: %v, %v; want nothing", again, err)
	}
}

// An agent that answers on its socket is still serving the node: no
// cleanup under it.
func TestCleanupNodeRefusesALiveAgent(t *testing.T) {
	o := cleanupFixture(t)
	l, err := net.Listen("unix", filepath.Join(o.PluginsDir, "carve.dev", "dra.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if removed, err := CleanupNode(context.Background(), o); err == nil || !strings.Contains(err.Error(), "an agent serves this node") {
		t.Errorf("with a live agent: %v, %v; want a refusal", removed, err)
	}
}
