package gpu_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/carve-dra/carve/gpu"
)

// processLibrary is an NVML whose one GPU lists these compute and MPS
// processes.
func processLibrary(compute, mpsList []nvml.ProcessInfo) gpu.Library {
	dev := &mock.Device{
		GetComputeRunningProcessesFunc:    func() ([]nvml.ProcessInfo, nvml.Return) { return compute, nvml.SUCCESS },
		GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return mpsList, nvml.SUCCESS },
	}
	return gpu.Library{Interface: &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			if uuid != "GPU-1" {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return dev, nvml.SUCCESS
		},
	}}
}

// NVML's "not available" is never a number of bytes; where the other list
// has a number for the same PID, the number is kept.
func TestProcessesNotAvailable(t *testing.T) {
	na := uint64(gpu.NotAvailable)
	lib := processLibrary(
		[]nvml.ProcessInfo{{Pid: 1, UsedGpuMemory: na}, {Pid: 2, UsedGpuMemory: na}, {Pid: 3, UsedGpuMemory: 5}},
		[]nvml.ProcessInfo{{Pid: 2, UsedGpuMemory: 7}, {Pid: 3, UsedGpuMemory: na}})
	s, err := gpu.Open(context.Background(), lib, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	got, err := s.Processes(context.Background(), "GPU-1")
	if err != nil {
		t.Fatal(err)
	}
	want := []gpu.Process{{PID: 1, UsedUnknown: true}, {PID: 2, UsedBytes: 7}, {PID: 3, UsedBytes: 5}}
	if len(got) != len(want) {
		t.Fatalf("processes %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("process %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// A lane's call goes through while the session's turn is held; closing the
// session closes its lanes.
func TestLaneDoesNotWaitForTheSession(t *testing.T) {
	lib := processLibrary([]nvml.ProcessInfo{{Pid: 9, UsedGpuMemory: 1}}, nil)
	s, err := gpu.Open(context.Background(), lib, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	lane := s.Lane()
	held, release, done := make(chan struct{}), make(chan struct{}), make(chan error)
	go func() {
		done <- s.Do(context.Background(), "a long prepare", func(gpu.Library) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	procs, err := lane.Processes(context.Background(), "GPU-1")
	select {
	case err := <-done:
		t.Fatalf("the session's call ended (%v) before the lane answered", err)
	default:
	}
	if err != nil || len(procs) != 1 || procs[0].PID != 9 {
		t.Fatalf("lane while the session is held: %+v, %v", procs, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.Close(context.Background())
	if _, err := lane.Processes(context.Background(), "GPU-1"); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("lane after Close: %v", err)
	}
}
