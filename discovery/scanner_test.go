package discovery_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
)

// scanned is a Scanner of a typical node that has scanned it once.
type scanned struct {
	*discovery.Scanner
	tree *sysfstest.Tree
	opts discovery.Options
}

func scanner(t *testing.T, opts discovery.Options) *scanned {
	t.Helper()
	tree := sysfstest.Typical(t.TempDir())
	opts.Root = tree.Root
	s := &scanned{Scanner: discovery.NewScanner(opts), tree: tree, opts: opts}
	s.scan(t, discovery.AnyChange())
	return s
}

// scan scans again and checks that it found what a first discovery finds.
func (s *scanned) scan(t *testing.T, c discovery.Changes) *discovery.Inventory {
	t.Helper()
	inv, err := s.Scan(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	first, err := discovery.Discover(context.Background(), s.opts)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(inv, first) {
		t.Errorf("the scan differs from a first discovery:\n%s", diffInventories(inv, first))
	}
	return inv
}

// diffInventories names the NICs, GPUs and FPGAs that differ.
func diffInventories(a, b *discovery.Inventory) string {
	var out []string
	byName := map[string]discovery.NIC{}
	for _, n := range b.NICs {
		byName[n.Name] = n
	}
	for _, n := range a.NICs {
		if m, ok := byName[n.Name]; !ok || !reflect.DeepEqual(n, m) {
			out = append(out, fmt.Sprintf("NIC %s: scan %+v (PCI %+v), first %+v (PCI %+v)", n.Name, n, n.PCI, m, m.PCI))
		}
	}
	if len(a.NICs) != len(b.NICs) {
		out = append(out, fmt.Sprintf("%d NICs, first discovery %d", len(a.NICs), len(b.NICs)))
	}
	if !reflect.DeepEqual(a.GPUs, b.GPUs) {
		out = append(out, fmt.Sprintf("GPUs %+v, first discovery %+v", a.GPUs, b.GPUs))
	}
	if !reflect.DeepEqual(a.FPGAs, b.FPGAs) {
		out = append(out, fmt.Sprintf("FPGAs %+v, first discovery %+v", a.FPGAs, b.FPGAs))
	}
	if len(out) == 0 {
		out = append(out, fmt.Sprintf("%+v\n%+v", *a, *b))
	}
	return strings.Join(out, "\n")
}

func gpuByAddress(inv *discovery.Inventory, addr string) *discovery.GPU {
	for i := range inv.GPUs {
		if inv.GPUs[i].Address == addr {
			return &inv.GPUs[i]
		}
	}
	return nil
}

const (
	typicalPF  = "0000:17:00.0" // ens1f0np0: 8 VFs possible, 2 enabled
	typicalGPU = "0000:c1:00.0"
)

// addVF enables one more VF of the typical node's PF, with its netdev.
func addVF(tree *sysfstest.Tree, numVFs int) {
	tree.AddVF(typicalPF, "0000:17:00.2", 0, sysfstest.PCI{Vendor: sysfstest.VendorMellanox, Device: sysfstest.DeviceCX6DxVF, Class: sysfstest.ClassEthernet, NUMANode: 0, Driver: "mlx5_core"})
	tree.AddNIC("ens1f0v0", sysfstest.NIC{PCIAddress: "0000:17:00.2", MAC: "b8:ce:f6:00:01:00", MTU: 9000, Speed: 25000, Carrier: 1})
	tree.Write(filepath.Join(tree.PCIDir(typicalPF), "sriov_numvfs"), strconv.Itoa(numVFs))
}

// What a Scanner keeps never hides a change from the next scan, even one
// told that no link changed (LinksChanged with no names): functions and
// netdevs that appear, go or are made again, a PF's VF count and a
// function's driver are checked on every scan.
func TestScannerSeesChanges(t *testing.T) {
	none := discovery.LinksChanged()
	t.Run("VF enabled", func(t *testing.T) {
		s := scanner(t, discovery.Options{})
		tree := s.tree
		addVF(tree, 3)
		inv := s.scan(t, none)
		vf := nicByName(inv, "ens1f0v0")
		if vf == nil || vf.PCI == nil || vf.PCI.Address != "0000:17:00.2" || vf.PCI.NUMANode != 0 || vf.PhysFn != typicalPF || vf.PCI.VendorID != "0x15b3" {
			t.Fatalf("new VF = %+v, want ens1f0v0 on 0000:17:00.2 behind %s", vf, typicalPF)
		}
		if pf := nicByName(inv, "ens1f0np0"); pf.SRIOV == nil || pf.SRIOV.NumVFs != 3 {
			t.Errorf("PF SR-IOV = %+v, want 3 VFs enabled", pf.SRIOV)
		}
	})
	t.Run("second VF enabled", func(t *testing.T) {
		// The first VF's IDs are new, and pci.ids is read to name
		// them; the second's names are those of the same IDs, as
		// that read gave them.
		s := scanner(t, discovery.Options{})
		tree := s.tree
		addVF(tree, 3)
		s.scan(t, none)
		tree.AddVF(typicalPF, "0000:17:00.3", 1, sysfstest.PCI{Vendor: sysfstest.VendorMellanox, Device: sysfstest.DeviceCX6DxVF, Class: sysfstest.ClassEthernet, NUMANode: 0, Driver: "mlx5_core"})
		tree.AddNIC("ens1f0v1", sysfstest.NIC{PCIAddress: "0000:17:00.3", MAC: "b8:ce:f6:00:01:01", MTU: 9000, Speed: 25000, Carrier: 1})
		tree.Write(filepath.Join(tree.PCIDir(typicalPF), "sriov_numvfs"), "4")
		vf := nicByName(s.scan(t, none), "ens1f0v1")
		if vf == nil || vf.PCI == nil {
			t.Fatalf("second VF = %+v", vf)
		}
		if _, err := os.Stat("/usr/share/misc/pci.ids"); err == nil && (vf.PCI.VendorName == "" || vf.PCI.ProductName == "") {
			t.Errorf("second VF unnamed: %+v", *vf.PCI)
		}
	})
	t.Run("VF disabled", func(t *testing.T) {
		s := scanner(t, discovery.Options{})
		tree := s.tree
		addVF(tree, 3)
		s.scan(t, none)
		tree.RemovePCI("0000:17:00.2")
		tree.Write(filepath.Join(tree.PCIDir(typicalPF), "sriov_numvfs"), "2")
		inv := s.scan(t, none)
		if vf := nicByName(inv, "ens1f0v0"); vf != nil {
			t.Errorf("disabled VF still listed: %+v", vf)
		}
		if pf := nicByName(inv, "ens1f0np0"); pf.SRIOV == nil || pf.SRIOV.NumVFs != 2 {
			t.Errorf("PF SR-IOV = %+v, want 2 VFs enabled", pf.SRIOV)
		}
	})
	t.Run("NIC added", func(t *testing.T) {
		s := scanner(t, discovery.Options{})
		tree := s.tree
		tree.AddPCI("0000:18:00.0", sysfstest.PCI{Vendor: sysfstest.VendorMellanox, Device: sysfstest.DeviceCX6Dx, Class: sysfstest.ClassEthernet, NUMANode: 1, Driver: "mlx5_core"})
		tree.AddNIC("ens2f0np0", sysfstest.NIC{PCIAddress: "0000:18:00.0", MAC: "b8:ce:f6:00:02:01", MTU: 1500, Speed: 100000, Carrier: 1})
		inv := s.scan(t, none)
		if n := nicByName(inv, "ens2f0np0"); n == nil || n.PCI == nil || n.PCI.NUMANode != 1 || n.SpeedMbps != 100000 {
			t.Errorf("new NIC = %+v, want ens2f0np0 at 100G on NUMA 1", n)
		}
	})
	t.Run("NIC removed", func(t *testing.T) {
		s := scanner(t, discovery.Options{})
		tree := s.tree
		tree.RemovePCI("0000:17:00.1")
		inv := s.scan(t, none)
		if n := nicByName(inv, "ens1f1np1"); n != nil {
			t.Errorf("removed NIC still listed: %+v", n)
		}
	})
	t.Run("driver rebound", func(t *testing.T) {
		s := scanner(t, discovery.Options{})
		tree := s.tree
		tree.Write("sys/bus/pci/drivers/vfio-pci/new_id", "")
		link := filepath.Join(tree.Root, tree.PCIDir(typicalGPU), "driver")
		if err := os.Remove(link); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("../../../bus/pci/drivers/vfio-pci", link); err != nil {
			t.Fatal(err)
		}
		if gpu := gpuByAddress(s.scan(t, none), typicalGPU); gpu == nil || gpu.Driver != "vfio-pci" {
			t.Errorf("GPU after rebinding = %+v, want driver vfio-pci", gpu)
		}
	})
	t.Run("function replaced", func(t *testing.T) {
		s := scanner(t, discovery.Options{})
		tree := s.tree
		// Another card in the GPU's slot: same address, a new entry.
		link := filepath.Join(tree.Root, "sys/bus/pci/devices", typicalGPU)
		old := inode(t, link)
		tree.RemovePCI(typicalGPU)
		tree.AddPCI(typicalGPU, sysfstest.PCI{Vendor: sysfstest.VendorNVIDIA, Device: 0x2335, Class: sysfstest.Class3DGPU, NUMANode: 0, Driver: "nvidia"})
		newInode(t, link, old)
		if gpu := gpuByAddress(s.scan(t, none), typicalGPU); gpu == nil || gpu.DeviceID != "0x2335" || gpu.NUMANode != 0 {
			t.Errorf("GPU after replacement = %+v, want device 0x2335 on NUMA 0", gpu)
		}
	})
	t.Run("netdev made again", func(t *testing.T) {
		s := scanner(t, discovery.Options{})
		tree := s.tree
		link := filepath.Join(tree.Root, "sys/class/net/ens1f1np1")
		old := inode(t, link)
		tree.RemoveNIC("ens1f1np1")
		tree.AddNIC("ens1f1np1", sysfstest.NIC{PCIAddress: "0000:17:00.1", MAC: "b8:ce:f6:00:00:02", MTU: 4000, Speed: 25000, Carrier: 1})
		newInode(t, link, old)
		if n := nicByName(s.scan(t, none), "ens1f1np1"); n == nil || n.MTU != 4000 || !n.LinkUsable() {
			t.Errorf("netdev made again = %+v, want MTU 4000 and up", n)
		}
	})
}

// A link's state is read again where its event names it, and on a rescan
// that reads every netdev.
func TestScannerRereadsLinks(t *testing.T) {
	for _, c := range []struct {
		name    string
		changes discovery.Changes
	}{{"its event", discovery.LinksChanged("eth0", "ens1f0np0")}, {"any change", discovery.AnyChange()}} {
		t.Run(c.name, func(t *testing.T) {
			s := scanner(t, discovery.Options{})
			tree := s.tree
			dir := tree.NetdevDir("ens1f0np0")
			tree.Write(filepath.Join(dir, "operstate"), "down")
			tree.Write(filepath.Join(dir, "carrier"), "0")
			tree.Write(filepath.Join(dir, "mtu"), "1500")
			n := nicByName(s.scan(t, c.changes), "ens1f0np0")
			if n == nil || n.LinkUsable() || n.MTU != 1500 {
				t.Errorf("ens1f0np0 after going down = %+v, want down with MTU 1500", n)
			}
		})
	}
}

// Names follow pci.ids: a new file names the functions again.
func TestScannerRenamesOnNewPCIIDs(t *testing.T) {
	ids := filepath.Join(t.TempDir(), "pci.ids")
	write := func(vendor string) {
		if err := os.WriteFile(ids, []byte("10de  "+vendor+"\n\t2330  GH100 [H100 SXM5 80GB]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("NVIDIA")
	t.Setenv("PCIDB_PATH", ids)
	s := scanner(t, discovery.Options{})
	if gpu := gpuByAddress(s.scan(t, discovery.LinksChanged()), typicalGPU); gpu == nil || gpu.VendorName != "NVIDIA" {
		t.Fatalf("GPU = %+v, want vendor NVIDIA", gpu)
	}
	write("NVIDIA Corporation")
	if gpu := gpuByAddress(s.scan(t, discovery.LinksChanged()), typicalGPU); gpu == nil || gpu.VendorName != "NVIDIA Corporation" {
		t.Errorf("GPU after pci.ids changed = %+v, want vendor NVIDIA Corporation", gpu)
	}
}

// FPGAs under their own root are checked on every scan too.
func TestScannerFPGARoot(t *testing.T) {
	cards := sysfstest.Typical(t.TempDir())
	s := scanner(t, discovery.Options{FPGARoot: cards.Root})
	cards.RemovePCI("0000:5e:00.0")
	if inv := s.scan(t, discovery.LinksChanged()); len(inv.FPGAs) != 1 || inv.FPGAs[0].Address != "0000:3b:00.0" {
		t.Errorf("FPGAs after one card went = %+v, want only 0000:3b:00.0", inv.FPGAs)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// newInode makes sure a link made again has another inode than old, as
// sysfs gives it (ext4 may hand a freed inode out again at once): where it
// has the same, it is replaced by a copy made while it still exists.
func newInode(t *testing.T, link string, old uint64) {
	t.Helper()
	if inode(t, link) != old {
		return
	}
	target, err := os.Readlink(link)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link+".new"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(link+".new", link); err != nil {
		t.Fatal(err)
	}
	if inode(t, link) == old {
		t.Fatalf("%s still has inode %d", link, old)
	}
}
