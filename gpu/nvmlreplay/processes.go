package nvmlreplay

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/carve-dra/carve/gpu"
)

// ProcessesFile is what a replay answers NVML's process queries
// (GetComputeRunningProcesses; GetMPSComputeRunningProcesses answers
// NOT_SUPPORTED, as on drivers that list MPS clients with the others) from,
// re-read on every query so that a test can change it while the agent runs:
//
//	{"processes": [
//	  {"gpuUUID": "GPU-17c6...", "pid": 4242, "usedBytes": 3221225472},
//	  {"gpuUUID": "GPU-17c6...", "pid": 4243}
//	]}
//
// pid is a PID as the reader of the replay sees it (the agent's, the host's
// with hostPID); usedBytes absent is NVML's "not available". Write it by
// rename: a query that finds it half written, or unreadable, fails as NVML's
// ERROR_UNKNOWN and is retried by the next. No file is no process. Without
// ProcessesFrom a replay has no processes.
type ProcessesFile struct {
	Processes []ReplayedProcess `json:"processes"`
}

// ReplayedProcess is one process of ProcessesFile.
type ReplayedProcess struct {
	GPUUUID   string  `json:"gpuUUID"`
	PID       uint32  `json:"pid"`
	UsedBytes *uint64 `json:"usedBytes,omitempty"`
}

// ReadProcessesFile reads a processes file strictly: unknown fields, a
// process without its GPU or PID, are errors naming what is wrong.
func ReadProcessesFile(path string) (ProcessesFile, error) {
	var f ProcessesFile
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, fmt.Errorf("NVML replay processes: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return f, fmt.Errorf("NVML replay processes %s: %w", path, err)
	}
	for i, p := range f.Processes {
		if p.GPUUUID == "" || p.PID == 0 {
			return f, fmt.Errorf("NVML replay processes %s: process %d has no gpuUUID or pid", path, i)
		}
	}
	return f, nil
}

// ProcessesFrom makes every replayed GPU answer its processes from path
// (ProcessesFile).
func (r *Replay) ProcessesFrom(path string) {
	for _, d := range r.Server.Devices {
		m := d.(*server.Device)
		uuid := m.UUID
		m.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			f, err := ReadProcessesFile(path)
			if err != nil {
				return nil, nvml.ERROR_UNKNOWN
			}
			var out []nvml.ProcessInfo
			for _, p := range f.Processes {
				if p.GPUUUID != uuid {
					continue
				}
				info := nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: gpu.NotAvailable}
				if p.UsedBytes != nil {
					info.UsedGpuMemory = *p.UsedBytes
				}
				out = append(out, info)
			}
			return out, nvml.SUCCESS
		}
		m.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
	}
}
