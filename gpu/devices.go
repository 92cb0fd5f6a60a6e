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
	// UsedUnknown: NVML said "not available" for its memory (it does so
	// under MIG, and where the caller may not see other processes' use).
	// UsedBytes is then 0, never NVML's sentinel, which as bytes would be
	// 16 EiB.
	UsedUnknown bool
}

// NotAvailable is nvml.VALUE_NOT_AVAILABLE (-1) as NVML's unsigned fields
// carry it: a reading that is not a number.
const NotAvailable = ^uint64(0)

// merge adds NVML's answer for a PID already listed: the larger of two
// amounts, and an amount over "not available".
func (p *Process) merge(used uint64) {
	switch {
	case used == NotAvailable:
	case p.UsedUnknown:
		p.UsedBytes, p.UsedUnknown = used, false
	default:
		p.UsedBytes = max(p.UsedBytes, used)
	}
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
// two amounts where both list it; "not available" only where neither has
// a number).
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
					out[i].merge(p.UsedGpuMemory)
					continue
				}
				byPID[p.Pid] = len(out)
				pr := Process{PID: p.Pid, UsedUnknown: true}
				pr.merge(p.UsedGpuMemory)
				out = append(out, pr)
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
