package fpga

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/carve-dra/carve/prepare/health"
	"github.com/carve-dra/carve/slices"
)

// FPGA health reasons (taint values).
const (
	ReasonDeviceNodeGone  = "DeviceNodeGone"
	ReasonPCIFunctionGone = "PCIFunctionGone"
	ReasonAFUChanged      = "AFUChanged"
)

// SourcePresence is the Condition.Source of the FPGA health source.
const SourcePresence = "fpga-presence"

// HealthSource watches each published FPGA's device nodes and PCI functions
// under Root: a card one of whose nodes or functions vanished is lost. An
// AFU changing under a claim is seen by rediscovery (AFUChanged).
type HealthSource struct {
	Root    string
	Devices func() map[string]slices.Entry
	// Poll is how often the card is looked at (2 s when 0).
	Poll time.Duration
}

// Check looks at every FPGA once.
func (h *HealthSource) Check(sink health.Sink) {
	for name, e := range h.Devices() {
		if e.FPGA == nil {
			continue
		}
		c := health.Condition{Device: name, Source: SourcePresence}
		for _, fn := range e.FPGA.Functions {
			if _, err := os.Lstat(filepath.Join(h.Root, "sys/bus/pci/devices", fn)); os.IsNotExist(err) {
				c.Severity, c.Reason, c.Message = health.Lost, ReasonPCIFunctionGone, fmt.Sprintf("FPGA %s: PCI function %s removed", e.FPGA.Address, fn)
			}
		}
		if c.Severity == health.Healthy {
			for _, n := range e.FPGA.DevNodes {
				if _, err := os.Lstat(filepath.Join(h.Root, n)); os.IsNotExist(err) {
					c.Severity, c.Reason, c.Message = health.Lost, ReasonDeviceNodeGone, fmt.Sprintf("FPGA %s: %s is gone", e.FPGA.Address, n)
					break
				}
			}
		}
		sink.Observe(c)
	}
}

// Run checks every Poll until ctx is done.
func (h *HealthSource) Run(ctx context.Context, sink health.Sink) error {
	every := h.Poll
	if every <= 0 {
		every = 2 * time.Second
	}
	wait.UntilWithContext(ctx, func(context.Context) { h.Check(sink) }, every)
	return nil
}
