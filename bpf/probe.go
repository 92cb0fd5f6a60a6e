package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TCSupport is how the running kernel lets a tc program see a device's
// frames, as tried rather than read from its configuration.
type TCSupport struct {
	// SchedCLS: the kernel loads tc (sched_cls) programs.
	SchedCLS bool
	// TCX: a program attaches to a device's TCX hook (Linux 6.6 and later).
	TCX bool
	// Clsact and ClsBPF: the clsact qdisc, and a cls_bpf filter on it.
	Clsact, ClsBPF bool
}

// ProbeTC tries each way of attaching a tc program on the device ifindex
// of the calling thread's network namespace, and removes what it attached.
// The device should be a throwaway one (a veth in a scratch namespace): a
// clsact qdisc it adds is left there. The thread must stay in that
// namespace for the call (runtime.LockOSThread).
func ProbeTC(ifindex int) (TCSupport, error) {
	var s TCSupport
	if err := features.HaveProgramType(ebpf.SchedCLS); err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			return s, nil
		}
		return s, fmt.Errorf("probe sched_cls programs: %w", err)
	}
	s.SchedCLS = true
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "carve_probe", Type: ebpf.SchedCLS, License: "GPL",
		// TC_ACT_UNSPEC (TCX_NEXT): what the shaper's programs return.
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, -1, asm.DWord), asm.Return()},
	})
	if err != nil {
		return s, fmt.Errorf("load a probe program: %w", err)
	}
	defer prog.Close()

	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXEgress})
	switch {
	case err == nil:
		s.TCX = true
		if err := l.Close(); err != nil {
			return s, fmt.Errorf("detach the TCX probe: %w", err)
		}
	case !errors.Is(err, ebpf.ErrNotSupported):
		return s, fmt.Errorf("probe TCX on ifindex %d: %w", ifindex, err)
	}

	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return s, nil // no clsact, so no cls_bpf either
	}
	s.Clsact = true
	filter := &netlink.BpfFilter{
		FilterAttrs:  netlink.FilterAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_MIN_EGRESS, Handle: 1, Priority: 1, Protocol: unix.ETH_P_ALL},
		Fd:           prog.FD(),
		Name:         "carve-probe",
		DirectAction: true,
	}
	if err := netlink.FilterAdd(filter); err == nil {
		s.ClsBPF = true
		if err := netlink.FilterDel(filter); err != nil {
			return s, fmt.Errorf("delete the cls_bpf probe: %w", err)
		}
	}
	return s, nil
}
