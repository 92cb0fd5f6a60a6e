package nettest

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestKernelLacksOnlyTheKernelsAnswer(t *testing.T) {
	for _, tc := range []struct {
		err  error
		f    Feature
		want bool
	}{
		{fmt.Errorf("add fq: %w", unix.ENOENT), Qdisc("made-up"), true},
		{unix.EINVAL, Qdisc("made-up"), false},
		{unix.EOPNOTSUPP, Qdisc("made-up"), false},
		{unix.EOPNOTSUPP, LinkKind("made-up"), true},
		{unix.ENOENT, LinkKind("made-up"), false},
		{unix.ENOENT, Filter("made-up"), true},
		{unix.EEXIST, Filter("made-up"), false},
		{fmt.Errorf("run: %w", ebpf.ErrNotSupported), BPF("BPF_PROG_RUN"), true},
		{unix.EPERM, BPF("BPF_PROG_RUN"), false},
		{nil, Qdisc("made-up"), false},
	} {
		if got := KernelLacks(tc.err, tc.f); got != tc.want {
			t.Errorf("KernelLacks(%v, %s) = %v, want %v", tc.err, tc.f, got, tc.want)
		}
	}
	// What the kernel builds in, it does not lack, whatever the errno.
	if kernelConfig("CONFIG_NET_SCH_HTB") == "y" && KernelLacks(unix.ENOENT, Qdisc("htb")) {
		t.Error("HTB is built in, yet ENOENT from it reads as the kernel lacking it")
	}
}

// The errnos KernelLacks expects are what this kernel answers: a kind it
// lacks is refused with them, and a kind it has is not.
func TestKernelLacksAgreesWithTheKernel(t *testing.T) {
	tp := New(t)
	h, err := netlink.NewHandleAt(tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	parent, err := h.LinkByName(tp.Parent)
	if err != nil {
		t.Fatal(err)
	}
	root := netlink.QdiscAttrs{LinkIndex: parent.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(1, 0)}
	for _, q := range []netlink.Qdisc{
		&netlink.GenericQdisc{QdiscAttrs: root, QdiscType: "carve-made-up"},
		&netlink.Fq{QdiscAttrs: root}, &netlink.FqCodel{QdiscAttrs: root}, &netlink.Netem{QdiscAttrs: root},
		netlink.NewHtb(root),
	} {
		err := h.QdiscReplace(q)
		t.Logf("qdisc %s: %v", q.Type(), err)
		checkAgrees(t, err, Qdisc(q.Type()))
		if err == nil {
			_ = h.QdiscDel(q)
		}
	}
	mk := func(name string) netlink.LinkAttrs {
		la := netlink.NewLinkAttrs()
		la.Name, la.ParentIndex = name, parent.Attrs().Index
		return la
	}
	for _, l := range []netlink.Link{
		&netlink.GenericLink{LinkAttrs: mk("mu0"), LinkType: "carve-made-up"},
		&netlink.IPVlan{LinkAttrs: mk("ipv0"), Mode: netlink.IPVLAN_MODE_L2},
		&netlink.Vlan{LinkAttrs: mk("vl0"), VlanId: 7},
		&netlink.Dummy{LinkAttrs: mk("dm0")},
		&netlink.Macvlan{LinkAttrs: mk("mv0"), Mode: netlink.MACVLAN_MODE_BRIDGE},
	} {
		err := h.LinkAdd(l)
		t.Logf("link %s: %v", l.Type(), err)
		checkAgrees(t, err, LinkKind(l.Type()))
	}
}

// checkAgrees: a kind the config builds in is accepted; a made-up kind, or
// one the config leaves out, is refused with the errno KernelLacks expects.
func checkAgrees(t *testing.T, err error, f Feature) {
	t.Helper()
	switch cfg := kernelConfig("CONFIG_" + f.config); {
	case f.config != "" && cfg == "y":
		if err != nil {
			t.Errorf("%s is built in, but: %v", f, err)
		}
	case f.config == "" || (cfg == "" && configReadable()):
		if !KernelLacks(err, f) {
			t.Errorf("%s is not in this kernel, but its error %v does not read as the kernel lacking it", f, err)
		}
	}
}

func configReadable() bool { return kernelConfig("CONFIG_NET") != "" }

// Where Required, a skip for lack of privilege is a failure.
func TestSkipUnlessRequired(t *testing.T) {
	for _, required := range []string{"", "1"} {
		t.Setenv(RequiredEnv, required)
		r := &recorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			SkipUnlessRequired(r, "needs root")
		}()
		<-done
		if failed := r.fatal != ""; failed != (required == "1") || r.skipped == failed {
			t.Errorf("%s=%q: failed %q, skipped %v", RequiredEnv, required, r.fatal, r.skipped)
		}
	}
}

type recorder struct {
	testing.TB
	fatal   string
	skipped bool
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Skip(...any) { r.skipped = true; runtime.Goexit() }
