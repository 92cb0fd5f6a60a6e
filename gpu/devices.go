package gpu

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Process is one process NVML reports on a GPU, with the device memory it
// holds. MPS clients are listed with their own PIDs.
type Process struct {
	PID       uint32
	UsedBytes uint64
}

// ComputeMode is NVML's compute mode of a GPU.
type ComputeMode = nvml.ComputeMode

// Compute modes carve uses.
const (
	ComputeModeDefault          = nvml.COMPUTEMODE_DEFAULT
	ComputeModeExclusiveProcess = nvml.COMPUTEMODE_EXCLUSIVE_PROCESS
)

func (s *Session) device(l Library, uuid string) (nvml.Device, error) {
	dev, ret := l.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, nvmlError("device "+uuid, ret)
	}
	return dev, nil
}

// Processes lists the compute processes on the GPU with this UUID: NVML's
// compute processes and its MPS clients, each PID once (the larger of the
// two amounts where both list it).
func (s *Session) Processes(ctx context.Context, uuid string) ([]Process, error) {
	var out []Process
	err := s.Do(ctx, "processes of "+uuid, func(l Library) error {
		dev, err := s.device(l, uuid)
		if err != nil {
			return err
		}
		byPID := map[uint32]int{}
		add := func(list []nvml.ProcessInfo) {
			for _, p := range list {
				if i, ok := byPID[p.Pid]; ok {
					out[i].UsedBytes = max(out[i].UsedBytes, p.UsedGpuMemory)
					continue
				}
				byPID[p.Pid] = len(out)
				out = append(out, Process{PID: p.Pid, UsedBytes: p.UsedGpuMemory})
			}
		}
		compute, ret := dev.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			return nvmlError("compute processes of "+uuid, ret)
		}
		add(compute)
		// Not every driver lists MPS clients apart; compute processes
		// already include them there.
		if mpsList, ret := dev.GetMPSComputeRunningProcesses(); ret == nvml.SUCCESS {
			add(mpsList)
		}
		return nil
	})
	return out, err
}

// Memory reports the GPU's total, free and used device memory.
func (s *Session) Memory(ctx context.Context, uuid string) (nvml.Memory, error) {
	var m nvml.Memory
	err := s.Do(ctx, "memory of "+uuid, func(l Library) error {
		dev, err := s.device(l, uuid)
		if err != nil {
			return err
		}
		var ret nvml.Return
		if m, ret = dev.GetMemoryInfo(); ret != nvml.SUCCESS {
			return nvmlError("memory of "+uuid, ret)
		}
		return nil
	})
	return m, err
}

// ComputeMode reads the GPU's compute mode.
func (s *Session) ComputeMode(ctx context.Context, uuid string) (ComputeMode, error) {
	var mode ComputeMode
	err := s.Do(ctx, "compute mode of "+uuid, func(l Library) error {
		dev, err := s.device(l, uuid)
		if err != nil {
			return err
		}
		var ret nvml.Return
		if mode, ret = dev.GetComputeMode(); ret != nvml.SUCCESS {
			return nvmlError("compute mode of "+uuid, ret)
		}
		return nil
	})
	return mode, err
}

// SetComputeMode sets the GPU's compute mode (root only).
func (s *Session) SetComputeMode(ctx context.Context, uuid string, mode ComputeMode) error {
	return s.Do(ctx, fmt.Sprintf("set compute mode %d on %s", mode, uuid), func(l Library) error {
		dev, err := s.device(l, uuid)
		if err != nil {
			return err
		}
		if ret := dev.SetComputeMode(mode); ret != nvml.SUCCESS {
			return nvmlError(fmt.Sprintf("set compute mode %d on %s", mode, uuid), ret)
		}
		return nil
	})
}
