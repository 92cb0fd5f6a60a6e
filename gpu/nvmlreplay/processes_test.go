package nvmlreplay_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/nvmlreplay"
)

// The replay answers the GPU's processes from the file, read again on each
// query: a test changes a PID's memory while the reader runs.
func TestProcessesFromFile(t *testing.T) {
	r, err := nvmlreplay.Load(results + "h100-580-carve-snapshot-nvml.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := gpu.Open(context.Background(), r.Library(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	inv, err := s.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	uuid := inv.Devices[0].UUID
	// Without a file: none.
	if got, err := s.Processes(context.Background(), uuid); err != nil || len(got) != 0 {
		t.Fatalf("processes without a file: %v %v", got, err)
	}
	path := filepath.Join(t.TempDir(), "processes.json")
	r.ProcessesFrom(path)
	if got, err := s.Processes(context.Background(), uuid); err != nil || len(got) != 0 {
		t.Fatalf("processes before the file exists: %v %v", got, err)
	}
	write := func(content string) {
		if err := os.WriteFile(path+".tmp", []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"processes": [{"gpuUUID": "` + uuid + `", "pid": 42, "usedBytes": 3221225472}, {"gpuUUID": "` + uuid + `", "pid": 43}, {"gpuUUID": "GPU-other", "pid": 44, "usedBytes": 1}]}`)
	got, err := s.Processes(context.Background(), uuid)
	if err != nil || len(got) != 2 || got[0].PID != 42 || got[0].UsedBytes != 3<<30 || got[0].UsedUnknown || got[1].PID != 43 || !got[1].UsedUnknown {
		t.Fatalf("processes: %+v %v", got, err)
	}
	write(`{"processes": [{"gpuUUID": "` + uuid + `", "pid": 42, "usedBytes": 1024}]}`)
	if got, err := s.Processes(context.Background(), uuid); err != nil || len(got) != 1 || got[0].UsedBytes != 1024 {
		t.Fatalf("processes after the change: %+v %v", got, err)
	}
	write(`{"processes": [{"gpuUUID": "` + uuid + `", "pid": 42, "used": 1}]}`)
	if _, err := s.Processes(context.Background(), uuid); err == nil {
		t.Error("a file with an unknown field answered")
	}
	if _, err := nvmlreplay.ReadProcessesFile(path); err == nil || !strings.Contains(err.Error(), `unknown field "used"`) {
		t.Errorf("strict read: %v", err)
	}
}

// A replayed GPU answers its compute mode, Default, and keeps one that is
// set, as a GPU memory share sets and restores it.
func TestComputeMode(t *testing.T) {
	r, err := nvmlreplay.Load(results + "h100-580-carve-snapshot-nvml.json")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := gpu.Open(ctx, r.Library(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	inv, err := s.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	uuid := inv.Devices[0].UUID
	if m, err := s.ComputeMode(ctx, uuid); err != nil || m != gpu.ComputeModeDefault {
		t.Fatalf("compute mode %d %v", m, err)
	}
	if err := s.SetComputeMode(ctx, uuid, gpu.ComputeModeExclusiveProcess); err != nil {
		t.Fatal(err)
	}
	if m, err := s.ComputeMode(ctx, uuid); err != nil || m != gpu.ComputeModeExclusiveProcess {
		t.Fatalf("compute mode after set %d %v", m, err)
	}
}
