package main

import (
	"encoding/json"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu/memslice"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/checkpoint"
)

// `carve shares` is a node check: a state directory without the agent's
// checkpoint is not the agent's and fails, saying where it looked; no
// shares is fine; a share that is not enforced exits 1 and says why, in the
// listing it prints.
func TestSharesCommand(t *testing.T) {
	state, pins := t.TempDir(), t.TempDir()
	stdout, stderr, code := runCarve(t, "", "shares", "--state-dir", state, "--bpf-pin-dir", pins, "--interval", "0", "-o", "json")
	if code != 1 || strings.TrimSpace(stdout) != "" || !strings.Contains(stderr, "no agent checkpoint at "+state+"/checkpoint.json") {
		t.Fatalf("a state directory without a checkpoint: exit %d, stdout %q, stderr %s", code, stdout, stderr)
	}

	bootID, err := checkpoint.ReadBootID("/")
	if err != nil {
		t.Skip(err)
	}
	cp, err := prepare.OpenCheckpoint(state, bootID, nil)
	if err != nil {
		t.Fatal(err)
	}
	// What the agent writes as it starts.
	if err := cp.Update(func(*prepare.Records) error { return nil }); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = runCarve(t, "", "shares", "--state-dir", state, "--bpf-pin-dir", pins, "--interval", "0", "-o", "json")
	if code != 0 || strings.TrimSpace(stdout) != "[]" {
		t.Fatalf("no shares: exit %d, stdout %q, stderr %s", code, stdout, stderr)
	}
	// The chart's agent container names the directories in its
	// environment: the command run there needs no flags.
	t.Setenv("CARVE_STATE_DIR", state)
	t.Setenv("CARVE_BPF_PIN_DIR", pins)
	if stdout, stderr, code := runCarve(t, "", "shares", "--interval", "0", "-o", "json"); code != 0 || strings.TrimSpace(stdout) != "[]" {
		t.Fatalf("directories from the environment: exit %d, stdout %q, stderr %s", code, stdout, stderr)
	}

	id := types.UID("s1")
	rec := prepare.ClaimRecord{UID: "u1", Namespace: "ns", Name: "c1", State: prepare.ClaimStarted, Allocations: []prepare.Allocation{{
		ClaimUID: "u1", ClaimNamespace: "ns", ClaimName: "c1", Request: "net", Device: "nic-eth0", Kind: "nic", ShareID: &id,
		Consumed: map[resourceapi.QualifiedName]resource.Quantity{"egressBandwidth": resource.MustParse("100M")}}}}
	if err := cp.Update(func(c *prepare.Records) error { c.Set(rec.UID, rec); return nil }); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = runCarve(t, "", "shares", "--state-dir", state, "--bpf-pin-dir", pins, "--interval", "0", "-o", "json")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil || len(rows) != 1 {
		t.Fatalf("stdout %q: %v", stdout, err)
	}
	if code != 1 || rows[0]["enforced"] != false || rows[0]["claim"] != "ns/c1" || rows[0]["egressBandwidth"] != 1e8 || !strings.Contains(stderr, "1 of 1 shares not enforced") {
		t.Errorf("a share not enforced: exit %d, rows %v, stderr %s", code, rows, stderr)
	}
	stdout, _, code = runCarve(t, "", "shares", "--state-dir", state, "--bpf-pin-dir", pins, "--interval", "0")
	if code != 1 || !strings.Contains(stdout, "ns/c1") || !strings.Contains(stdout, "preparation not completed") {
		t.Errorf("table: exit %d\n%s", code, stdout)
	}
	if _, _, code := runCarve(t, "", "shares", "-o", "yaml"); code != 2 {
		t.Errorf("-o yaml: exit %d, want 2", code)
	}
}

// A GPU memory share is listed beside the NIC ones. On this machine (no
// NVML, no agent) its use is unknown, and says so; its daemon not running,
// it is not enforced and the command exits 1.
func TestSharesCommandGPU(t *testing.T) {
	state, pins := t.TempDir(), t.TempDir()
	bootID, err := checkpoint.ReadBootID("/")
	if err != nil {
		t.Skip(err)
	}
	cp, err := prepare.OpenCheckpoint(state, bootID, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := types.UID("s1")
	undo, _ := json.Marshal(memslice.Record{Tier: memslice.TierMPSPoliced, UUID: "GPU-1", Slice: 10 << 30})
	rec := prepare.ClaimRecord{UID: "u1", Namespace: "ns", Name: "train", State: prepare.ClaimCompleted, Allocations: []prepare.Allocation{{
		ClaimUID: "u1", ClaimNamespace: "ns", ClaimName: "train", Request: "gpu", Device: "gpu-0000-19-00-0", Kind: "gpu", ShareID: &id,
		Consumed: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi")}}}, Undo: []json.RawMessage{undo}}
	if err := cp.Update(func(c *prepare.Records) error { c.Set(rec.UID, rec); return nil }); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runCarve(t, "", "shares", "--state-dir", state, "--bpf-pin-dir", pins, "--interval", "0", "-o", "json", "--nvidia-driver-root", t.TempDir())
	var rows []map[string]any
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil || len(rows) != 1 {
		t.Fatalf("stdout %q: %v\n%s", stdout, err, stderr)
	}
	g, _ := rows[0]["gpu"].(map[string]any)
	if code != 1 || rows[0]["kind"] != "gpu" || rows[0]["enforced"] != false || g["usedBytes"] != nil || !strings.Contains(str(g["usedUnknown"]), "NVML") {
		t.Errorf("exit %d, row %v", code, rows[0])
	}
	stdout, _, code = runCarve(t, "", "shares", "--state-dir", state, "--bpf-pin-dir", pins, "--interval", "0", "--nvidia-driver-root", t.TempDir())
	t.Logf("carve shares:\n%s", stdout)
	if code != 1 || !strings.Contains(stdout, "ns/train") || !strings.Contains(stdout, "unknown:") || !strings.Contains(stdout, "MPS control daemon of GPU-1 is not running") {
		t.Errorf("table: exit %d\n%s", code, stdout)
	}
}

func str(v any) string { s, _ := v.(string); return s }
