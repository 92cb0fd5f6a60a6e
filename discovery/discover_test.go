package discovery_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
)

func discover(t *testing.T, root string, filter discovery.NetFilter) *discovery.Inventory {
	t.Helper()
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: root, Net: filter})
	if err != nil {
		t.Fatalf("Discover(%s): %v", root, err)
	}
	return inv
}

func nicByName(inv *discovery.Inventory, name string) *discovery.NIC {
	for i := range inv.NICs {
		if inv.NICs[i].Name == name {
			return &inv.NICs[i]
		}
	}
	return nil
}

func TestTypicalNode(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	inv := discover(t, tree.Root, discovery.NetFilter{})

	var names []string
	for _, n := range inv.NICs {
		names = append(names, n.Name)
	}
	if want := []string{"ens1f0np0", "ens1f1np1", "eth0"}; !reflect.DeepEqual(names, want) {
		t.Errorf("NICs = %v, want only the PCI-backed %v", names, want)
	}
	pf := nicByName(inv, "ens1f0np0")
	if pf == nil || pf.PCI == nil {
		t.Fatalf("ens1f0np0 missing or without PCI: %+v", pf)
	}
	if pf.PCI.Address != "0000:17:00.0" || pf.PCI.PCIeRoot != "pci0000:16" || pf.PCI.NUMANode != 0 {
		t.Errorf("ens1f0np0 PCI = %+v, want 0000:17:00.0 on pci0000:16, NUMA 0", *pf.PCI)
	}
	if pf.SpeedMbps != 25000 || pf.MTU != 9000 || pf.MAC != "b8:ce:f6:00:00:01" || pf.Driver != "mlx5_core" || !pf.LinkUsable() {
		t.Errorf("ens1f0np0 = %+v", *pf)
	}
	if pf.SRIOV == nil || pf.SRIOV.TotalVFs != 8 || pf.SRIOV.NumVFs != 2 {
		t.Errorf("ens1f0np0 SR-IOV = %+v, want 8 total, 2 enabled", pf.SRIOV)
	}
	if down := nicByName(inv, "ens1f1np1"); down.SpeedMbps != 0 || down.LinkUsable() {
		t.Errorf("ens1f1np1 (down) = %+v, want unknown speed, unusable link", *down)
	}
	if virtio := nicByName(inv, "eth0"); virtio.SpeedMbps != 0 || virtio.PCI.NUMANode != -1 || virtio.PCI.PCIeRoot != "pci0000:00" {
		t.Errorf("eth0 (virtio) = %+v PCI %+v", *virtio, *virtio.PCI)
	}

	if len(inv.LLCs) != 2 {
		t.Fatalf("LLCs = %+v, want 2", inv.LLCs)
	}
	l := inv.LLCs[1]
	if l.ID != 1 || l.SizeBytes != 32<<20 || l.Ways != 16 || l.CPUs != "16-31" || l.Resctrl == nil || discovery.MaskWays(l.Resctrl.CBMMask) != 16 {
		t.Errorf("LLC 1 = %+v (resctrl %+v)", l, l.Resctrl)
	}

	if len(inv.FPGAs) != 2 {
		t.Fatalf("FPGAs = %+v, want Xilinx and Intel", inv.FPGAs)
	}
	if x := inv.FPGAs[0]; x.VendorID != "0x10ee" || x.DeviceID != "0x5004" || x.Driver != "xclmgmt" {
		t.Errorf("Xilinx FPGA = %+v", x)
	}
	if len(inv.GPUs) != 1 || inv.GPUs[0].Address != "0000:c1:00.0" || inv.GPUs[0].NUMANode != 1 {
		t.Errorf("GPUs = %+v", inv.GPUs)
	}
	if !inv.Kernel.Known || !inv.Kernel.CanShareNIC() || inv.Kernel.FQ || inv.Kernel.IPVlan {
		t.Errorf("kernel = %+v, want known, able to share NICs, no fq or ipvlan", inv.Kernel)
	}
}

func TestNetFilter(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	// carve's own links: a share's interface before its pod takes it, a
	// parent's ingress IFB and egress shaper pair. Never NICs, whatever the
	// filter says.
	tree.AddNIC("cv0123456789", sysfstest.NIC{MAC: "02:01:02:03:04:05", MTU: 1500})
	tree.AddNIC("cvifb7", sysfstest.NIC{MAC: "02:01:02:03:04:06", MTU: 1500})
	tree.AddNIC("cveg7", sysfstest.NIC{MAC: "02:01:02:03:04:08", MTU: 65535})
	tree.AddNIC("cveg7r", sysfstest.NIC{MAC: "02:01:02:03:04:09", MTU: 65535})
	tree.AddNIC("cv7.100", sysfstest.NIC{MAC: "02:01:02:03:04:07", MTU: 1500})
	for _, tc := range []struct {
		filter discovery.NetFilter
		want   []string
	}{
		{discovery.NetFilter{IncludeVirtual: true}, []string{"ens1f0np0", "ens1f1np1", "eth0", "lo", "veth0"}},
		{discovery.NetFilter{IncludeVirtual: true, Exclude: []string{"lo"}}, []string{"ens1f0np0", "ens1f1np1", "eth0", "veth0"}},
		{discovery.NetFilter{Include: []string{"ens*"}}, []string{"ens1f0np0", "ens1f1np1"}},
		{discovery.NetFilter{Include: []string{"veth*"}}, nil},
		{discovery.NetFilter{IncludeVirtual: true, Include: []string{"cv*", "veth*"}}, []string{"veth0"}},
	} {
		inv := discover(t, tree.Root, tc.filter)
		var got []string
		for _, n := range inv.NICs {
			got = append(got, n.Name)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("filter %+v: NICs %v, want %v", tc.filter, got, tc.want)
		}
		if v := nicByName(inv, "veth0"); v != nil && (!v.Virtual || v.PCI != nil) {
			t.Errorf("veth0 = %+v, want virtual without PCI", *v)
		}
	}
}

// Missing optional files give fewer attributes, never a failure.
func TestMissingOptionalFiles(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	pf := tree.PCIDir("0000:17:00.0")
	for _, f := range []string{
		filepath.Join(pf, "numa_node"),
		filepath.Join(pf, "net/ens1f0np0/speed"),
		filepath.Join(pf, "net/ens1f0np0/mtu"),
		filepath.Join(pf, "sriov_totalvfs"),
		"sys/devices/system/cpu/cpu0/cache/index3/ways_of_associativity",
		"sys/fs/resctrl",
		"proc/config.gz",
	} {
		tree.Remove(f)
	}
	inv := discover(t, tree.Root, discovery.NetFilter{})
	n := nicByName(inv, "ens1f0np0")
	if n.PCI.NUMANode != -1 || n.SpeedMbps != 0 || n.MTU != 0 || n.SRIOV != nil {
		t.Errorf("ens1f0np0 = %+v, want the missing values unknown", *n)
	}
	if inv.LLCs[0].Resctrl != nil {
		t.Errorf("LLC 0 has resctrl after its removal")
	}
	if inv.Kernel.Known {
		t.Errorf("kernel features known without a config: %+v", inv.Kernel)
	}
}

// A malformed file is an error that names the file. The L3's files are
// cpu16's, the first CPU of the typical node's second L3: the CPUs after
// the first of an L3's shared_cpu_list are not read (listLLCs).
func TestMalformedFileNamed(t *testing.T) {
	for _, tc := range []struct{ file, content string }{
		{"sys/devices/system/cpu/cpu16/cache/index3/size", "lots"},
		{"sys/devices/system/cpu/cpu16/cache/index3/shared_cpu_list", "0-x"},
		{"sys/fs/resctrl/info/L3/cbm_mask", "zz"},
		{"NIC/mtu", "nine thousand"},
		{"PCI/numa_node", "one"},
	} {
		tree := sysfstest.Typical(t.TempDir())
		file := tc.file
		file = strings.Replace(file, "NIC", filepath.Join(tree.PCIDir("0000:17:00.0"), "net/ens1f0np0"), 1)
		file = strings.Replace(file, "PCI", tree.PCIDir("0000:3b:00.0"), 1)
		tree.Write(file, tc.content)
		_, err := discovery.Discover(context.Background(), discovery.Options{Root: tree.Root})
		if err == nil {
			t.Errorf("%s = %q: no error", file, tc.content)
			continue
		}
		// The file may be named by its real path or through the
		// sys/class and sys/bus symlinks; either names it.
		if !strings.Contains(err.Error(), tree.Root) || !strings.Contains(err.Error(), "/"+filepath.Base(file)+":") {
			t.Errorf("%s = %q: error %q does not name the file", file, tc.content, err)
		}
	}
}

// Without a pci.ids database, IDs are still published, without names; and a
// function without modalias (which made ghw drop the whole bus) does not
// hide the others.
func TestPCIWithoutNames(t *testing.T) {
	t.Setenv("PCIDB_PATH", filepath.Join(t.TempDir(), "no-such-pci.ids"))
	tree := sysfstest.Typical(t.TempDir())
	tree.AddPCI("0000:ff:00.0", sysfstest.PCI{Vendor: 0x1234, Device: 1, Class: 0x058000, NoModalias: true})
	inv := discover(t, tree.Root, discovery.NetFilter{})
	if len(inv.FPGAs) != 2 || inv.FPGAs[0].VendorID != "0x10ee" || inv.FPGAs[0].VendorName != "" {
		t.Errorf("FPGAs without pci.ids = %+v", inv.FPGAs)
	}
	if len(inv.GPUs) != 1 || inv.GPUs[0].Class != "0x030200" {
		t.Errorf("GPUs without pci.ids = %+v", inv.GPUs)
	}
}

func TestPCINamesFromDatabase(t *testing.T) {
	if _, err := os.Stat("/usr/share/misc/pci.ids"); errors.Is(err, os.ErrNotExist) {
		t.Skip("no pci.ids here (Debian package pci.ids): names cannot be checked")
	} else if err != nil {
		t.Fatal(err)
	}
	inv := discover(t, sysfstest.Typical(t.TempDir()).Root, discovery.NetFilter{})
	if inv.GPUs[0].VendorName == "" || !strings.Contains(strings.ToLower(inv.GPUs[0].VendorName), "nvidia") {
		t.Errorf("GPU vendor name = %q, want NVIDIA's", inv.GPUs[0].VendorName)
	}
}

func TestLLCWithoutIDUsesFirstCPU(t *testing.T) {
	tree := sysfstest.New(t.TempDir())
	tree.AddLLC(sysfstest.LLC{CPUs: []int{4, 5, 6, 7}, Size: "8M", Ways: 8, NoIDs: true})
	inv := discover(t, tree.Root, discovery.NetFilter{})
	if len(inv.LLCs) != 1 || inv.LLCs[0].ID != 4 || inv.LLCs[0].SizeBytes != 8<<20 || inv.LLCs[0].CPUs != "4-7" {
		t.Errorf("LLCs = %+v", inv.LLCs)
	}
}

// The real host this runs on: whatever it has, discovery must succeed and
// report every L3 it has.
func TestThisHost(t *testing.T) {
	inv := discover(t, "/", discovery.NetFilter{})
	matches, _ := filepath.Glob("/sys/devices/system/cpu/cpu*/cache/index3")
	if len(matches) > 0 && len(inv.LLCs) == 0 {
		t.Errorf("host has L3 entries %v but no LLC was found", matches)
	}
	t.Logf("this host: %d NICs, %d LLCs, %d FPGAs, %d GPUs, kernel %+v", len(inv.NICs), len(inv.LLCs), len(inv.FPGAs), len(inv.GPUs), inv.Kernel)
}

// CPUCacheRoot replaces the root for the CPU cache tree only: the fixture's
// L3 is read, the root's own caches are not, and NICs and PCI still come
// from the root. An empty cache root makes discovery blind to every L3.
func TestCPUCacheRootOverlay(t *testing.T) {
	root := sysfstest.Typical(t.TempDir())
	cache := sysfstest.New(t.TempDir())
	cache.AddLLC(sysfstest.LLC{ID: 7, CPUs: []int{0, 1}, Size: "12M", Ways: 12})
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: root.Root, CPUCacheRoot: cache.Root})
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.LLCs) != 1 || inv.LLCs[0].ID != 7 || inv.LLCs[0].SizeBytes != 12<<20 || inv.LLCs[0].Ways != 12 || inv.LLCs[0].Resctrl != nil {
		t.Errorf("LLCs from the cache root = %+v, want only llc 7 (12M, 12 ways, no resctrl)", inv.LLCs)
	}
	whole := discover(t, root.Root, discovery.NetFilter{})
	if len(inv.NICs) != len(whole.NICs) || len(inv.GPUs) != len(whole.GPUs) || len(inv.FPGAs) != len(whole.FPGAs) {
		t.Errorf("the cache root changed other kinds: %d/%d NICs, %d/%d GPUs, %d/%d FPGAs",
			len(inv.NICs), len(whole.NICs), len(inv.GPUs), len(whole.GPUs), len(inv.FPGAs), len(whole.FPGAs))
	}
	blind, err := discovery.Discover(context.Background(), discovery.Options{Root: root.Root, CPUCacheRoot: t.TempDir()})
	if err != nil {
		t.Fatalf("an empty cache root (a VM without cpu*/cache): %v", err)
	}
	if len(blind.LLCs) != 0 {
		t.Errorf("an empty cache root still gave LLCs %+v", blind.LLCs)
	}
}

// A netdev's driver is its device's: the PCI function's where the netdev
// sits in the function's directory (taken from the PCI scan), its own
// device's where it sits below another device, as virtio's netdevs sit
// below a virtio device whose driver is virtio_net, not virtio-pci.
func TestNICDriverIsItsDevices(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	const fn = "0000:00:04.0"
	fnDir := tree.AddPCI(fn, sysfstest.PCI{Vendor: sysfstest.VendorRedHat, Device: 0x1041, Class: sysfstest.ClassEthernet, NUMANode: -1, Driver: "virtio-pci"})
	virtio := filepath.Join(fnDir, "virtio1")
	netdev := filepath.Join(virtio, "net/eth1")
	for file, v := range map[string]string{"address": "02:fc:00:00:00:02", "mtu": "1500", "speed": "-1", "operstate": "up", "carrier": "1", "dev_port": "0"} {
		tree.Write(filepath.Join(netdev, file), v)
	}
	tree.Write("sys/bus/virtio/drivers/virtio_net/bind", "")
	for link, target := range map[string]string{
		filepath.Join(virtio, "driver"): "sys/bus/virtio/drivers/virtio_net",
		filepath.Join(netdev, "device"): virtio,
		"sys/class/net/eth1":            netdev,
	} {
		rel, err := filepath.Rel(filepath.Dir(link), target)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(rel, filepath.Join(tree.Root, link)); err != nil {
			t.Fatal(err)
		}
	}
	inv := discover(t, tree.Root, discovery.NetFilter{})
	if n := nicByName(inv, "eth1"); n == nil || n.Driver != "virtio_net" || n.PCI == nil || n.PCI.Address != fn || n.PCI.Driver != "virtio-pci" {
		t.Errorf("eth1 = %+v, want driver virtio_net on %s (driver virtio-pci)", n, fn)
	}
	if n := nicByName(inv, "ens1f0np0"); n == nil || n.Driver != "mlx5_core" || n.PCI == nil || n.PCI.Driver != "mlx5_core" {
		t.Errorf("ens1f0np0 = %+v, want driver mlx5_core, its function's", n)
	}
}
