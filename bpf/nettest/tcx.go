package nettest

import (
	"math"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// LacksTCX reports whether the running kernel has no TCX (before 6.6, as
// Debian 12's 6.1 in make vmtest): carve then attaches through cls_bpf, and
// redirects ingress to the IFB with act_mirred, which takes all of the
// parent's ingress (bpf.AttachRedirect). cilium/ebpf answers a TCX attach
// with ErrNotSupported only then; to a device that does not exist, ENODEV.
func LacksTCX(t testing.TB) bool {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, -1, asm.DWord), asm.Return()}})
	if err != nil {
		t.Fatalf("load a tc program: %v", err)
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXEgress})
	if err == nil {
		l.Close()
		t.Fatal("TCX attach to ifindex MaxInt32 succeeded")
	}
	return KernelLacks(err, BPF("TCX"))
}
