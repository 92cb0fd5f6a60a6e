package sharelist

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/carve-dra/carve/prepare/health"
)

func TestAddHealth(t *testing.T) {
	dir := t.TempDir()
	if err := health.WriteFile(dir, health.File{Updated: time.Now(), Devices: map[string]health.FileEntry{
		"nic-eth1": {Kind: "nic", Severity: "degraded", Reason: "LinkDown", Message: "LinkDown: eth1: carrier off", Taint: "carve.dev/unhealthy=LinkDown:NoExecute"},
	}}); err != nil {
		t.Fatal(err)
	}
	rows := []Row{{Claim: "ns/a", Device: "nic-eth1", Enforced: true}, {Claim: "ns/b", Device: "nic-eth2", Enforced: true}}
	if err := AddHealth(rows, dir); err != nil {
		t.Fatal(err)
	}
	if rows[0].Health != "degraded" || rows[0].Taint != "carve.dev/unhealthy=LinkDown:NoExecute" || rows[1].Health != "healthy" || rows[1].Taint != "" {
		t.Fatalf("rows %+v", rows)
	}
	var out bytes.Buffer
	if err := Write(&out, rows, "table"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "degraded (carve.dev/unhealthy=LinkDown:NoExecute)") || !strings.Contains(out.String(), "HEALTH") {
		t.Errorf("table:\n%s", out.String())
	}
	// No health file: every device healthy.
	rows = []Row{{Device: "nic-eth1"}}
	if err := AddHealth(rows, t.TempDir()); err != nil || rows[0].Health != "healthy" {
		t.Errorf("without a file: %+v, %v", rows, err)
	}
}
