package kernelprobe

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/discovery"
)

// The probe must agree with the running kernel's configuration where it
// has one: every feature built in (=y) is found, every one not set is not.
// Modules (=m) are left out: whether they load depends on the host.
func TestProbeAgreesWithConfig(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the probe makes a network namespace")
	}
	config := runningConfig(t)
	before, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	nsBefore, _ := netns.Get()
	defer nsBefore.Close()

	p := &Prober{}
	k, err := p.Probe(context.Background())
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	t.Logf("probed: %+v", k)
	for _, f := range []struct {
		option string
		got    bool
	}{
		{"BPF_SYSCALL", k.BPF}, {"NET_XGRESS", k.TCX}, {"NET_SCH_INGRESS", k.Clsact}, {"NET_CLS_BPF", k.ClsBPF},
		{"NET_SCH_HTB", k.HTB}, {"NET_SCH_FQ", k.FQ}, {"IFB", k.IFB}, {"NET_ACT_MIRRED", k.Mirred},
		{"NET_CLS_U32", k.U32}, {"MACVLAN", k.Macvlan}, {"IPVLAN", k.IPVlan}, {"X86_CPU_RESCTRL", k.Resctrl},
	} {
		switch config["CONFIG_"+f.option] {
		case "y":
			if !f.got {
				t.Errorf("CONFIG_%s=y but the probe did not find it", f.option)
			}
		case "", "n":
			if f.got {
				t.Errorf("CONFIG_%s is not set but the probe found it", f.option)
			}
		}
	}
	// Nothing is left behind: the caller's namespace and links are as
	// they were.
	after, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("links before the probe %d, after %d", len(before), len(after))
	}
	for _, l := range after {
		if strings.HasPrefix(l.Attrs().Name, "cvprobe") {
			t.Errorf("probe link %s left in the caller's namespace", l.Attrs().Name)
		}
	}
	if now, _ := netns.Get(); !now.Equal(nsBefore) {
		t.Errorf("the probe left this thread in another namespace")
	}
	// Answered once: a second call does not probe again.
	again, err := p.Probe(context.Background())
	if err != nil || again != k {
		t.Errorf("second probe = %+v, %v; want the first's", again, err)
	}
}

func TestHasFilesystem(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(root+"/proc", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(root+"/proc/filesystems", []byte("nodev\tsysfs\nnodev\tresctrl\n\text4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !hasFilesystem(root, "resctrl") || !hasFilesystem(root, "ext4") || hasFilesystem(root, "bpf") || hasFilesystem(t.TempDir(), "ext4") {
		t.Error("hasFilesystem misreads proc/filesystems")
	}
}

func runningConfig(t *testing.T) map[string]string {
	b, err := os.ReadFile("/proc/config.gz")
	if err != nil {
		t.Skipf("no /proc/config.gz to compare with: %v", err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	text, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	m, err := discovery.ParseKernelConfig(string(text))
	if err != nil {
		t.Fatal(err)
	}
	return m
}
