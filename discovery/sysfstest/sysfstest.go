// Package sysfstest builds fake host roots laid out the way real sysfs is:
// functions live under sys/devices/pci<domain>:<bus>/..., and sys/bus/pci/devices
// and sys/class/net are symlinks into that tree. Tests, fuzzers and
// benchmarks point discovery at such a root.
package sysfstest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Tree is a fake host root under construction. Methods panic on I/O errors:
// they only ever write below a test's temporary directory.
type Tree struct {
	Root string
	// llcIDs are the caches added, the domains of a resctrl added after.
	llcIDs []int
}

// New creates the skeleton of a root at dir.
func New(dir string) *Tree {
	t := &Tree{Root: dir}
	for _, d := range []string{"sys/bus/pci/devices", "sys/bus/pci/drivers", "sys/class/net", "sys/devices/system/cpu", "sys/devices/virtual/net", "proc/sys/kernel", "dev"} {
		t.mkdir(d)
	}
	return t
}

// PCI describes one PCI function.
type PCI struct {
	Vendor, Device uint16
	// Class is the 24-bit class code, e.g. 0x020000 for Ethernet.
	Class    uint32
	NUMANode int
	Driver   string
	// Parent is the address of the bridge the function sits behind; empty
	// puts it directly on its root complex.
	Parent string
	// NoModalias leaves out the modalias file, as on a broken device.
	NoModalias bool
}

// AddPCI creates a PCI function and returns its directory relative to Root.
func (t *Tree) AddPCI(addr string, p PCI) string {
	dir := "sys/devices/pci" + addr[:7]
	if p.Parent != "" {
		dir = t.PCIDir(p.Parent)
	}
	dir = filepath.Join(dir, addr)
	t.mkdir(dir)
	if !p.NoModalias {
		t.write(filepath.Join(dir, "modalias"), fmt.Sprintf("pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X",
			p.Vendor, p.Device, p.Vendor, 0, p.Class>>16, (p.Class>>8)&0xff, p.Class&0xff))
	}
	t.write(filepath.Join(dir, "vendor"), fmt.Sprintf("0x%04x", p.Vendor))
	t.write(filepath.Join(dir, "device"), fmt.Sprintf("0x%04x", p.Device))
	t.write(filepath.Join(dir, "class"), fmt.Sprintf("0x%06x", p.Class))
	t.write(filepath.Join(dir, "numa_node"), fmt.Sprint(p.NUMANode))
	t.symlink(filepath.Join(dir, "subsystem"), "sys/bus/pci")
	if p.Driver != "" {
		t.mkdir(filepath.Join("sys/bus/pci/drivers", p.Driver))
		t.symlink(filepath.Join(dir, "driver"), filepath.Join("sys/bus/pci/drivers", p.Driver))
	}
	t.symlink(filepath.Join("sys/bus/pci/devices", addr), dir)
	return dir
}

// PCIDir is the directory of an existing function, relative to Root.
func (t *Tree) PCIDir(addr string) string {
	resolved, err := filepath.EvalSymlinks(filepath.Join(t.Root, "sys/bus/pci/devices", addr))
	if err != nil {
		panic(err)
	}
	rel, _ := filepath.Rel(t.Root, resolved)
	return rel
}

// NIC describes a netdev.
type NIC struct {
	// PCIAddress puts the netdev under that function; empty makes it
	// virtual.
	PCIAddress string
	MAC        string
	MTU        int
	// Speed in Mbit/s; -1 as virtio reports it.
	Speed     int
	OperState string
	Carrier   int
	DevPort   int
	// TotalVFs and NumVFs make the function an SR-IOV PF.
	TotalVFs, NumVFs int
}

// AddNIC creates sys/class/net/<name> and the netdev directory it points to.
func (t *Tree) AddNIC(name string, n NIC) {
	dir := filepath.Join("sys/devices/virtual/net", name)
	if n.PCIAddress != "" {
		pdir := t.PCIDir(n.PCIAddress)
		dir = filepath.Join(pdir, "net", name)
		t.symlink(filepath.Join(dir, "device"), pdir)
		if n.TotalVFs > 0 {
			t.write(filepath.Join(pdir, "sriov_totalvfs"), fmt.Sprint(n.TotalVFs))
			t.write(filepath.Join(pdir, "sriov_numvfs"), fmt.Sprint(n.NumVFs))
		}
	}
	t.mkdir(dir)
	if n.OperState == "" {
		n.OperState = "up"
	}
	for file, v := range map[string]string{
		"address": n.MAC, "mtu": fmt.Sprint(n.MTU), "speed": fmt.Sprint(n.Speed),
		"operstate": n.OperState, "carrier": fmt.Sprint(n.Carrier), "dev_port": fmt.Sprint(n.DevPort),
	} {
		t.write(filepath.Join(dir, file), v)
	}
	t.symlink(filepath.Join("sys/class/net", name), dir)
}

// AddVF creates a virtual function behind a PF, with its physfn and virtfnN
// links.
func (t *Tree) AddVF(pf, vf string, index int, p PCI) {
	p.Parent = ""
	dir := t.AddPCI(vf, p)
	t.symlink(filepath.Join(dir, "physfn"), t.PCIDir(pf))
	t.symlink(filepath.Join(t.PCIDir(pf), fmt.Sprintf("virtfn%d", index)), dir)
}

// NetdevDir is the directory of an existing netdev, relative to Root.
func (t *Tree) NetdevDir(name string) string {
	resolved, err := filepath.EvalSymlinks(filepath.Join(t.Root, "sys/class/net", name))
	if err != nil {
		panic(err)
	}
	rel, _ := filepath.Rel(t.Root, resolved)
	return rel
}

// RemoveNIC removes a netdev, as its driver does when the device goes.
func (t *Tree) RemoveNIC(name string) {
	dir := t.NetdevDir(name)
	t.Remove(filepath.Join("sys/class/net", name))
	t.Remove(dir)
}

// RemovePCI removes a function, as a hot unplug or disabling a VF does:
// its sys/bus/pci/devices link, its directory, and a VF's virtfn link on
// its PF. Its netdevs go with it.
func (t *Tree) RemovePCI(addr string) {
	dir := t.PCIDir(addr)
	if pf, err := filepath.EvalSymlinks(filepath.Join(t.Root, dir, "physfn")); err == nil {
		links, _ := filepath.Glob(filepath.Join(pf, "virtfn*"))
		for _, l := range links {
			if target, err := filepath.EvalSymlinks(l); err == nil && target == filepath.Join(t.Root, dir) {
				_ = os.Remove(l)
			}
		}
	}
	nets, _ := os.ReadDir(filepath.Join(t.Root, dir, "net"))
	for _, n := range nets {
		t.Remove(filepath.Join("sys/class/net", n.Name()))
	}
	t.Remove(filepath.Join("sys/bus/pci/devices", addr))
	t.Remove(dir)
}

// LLC describes a level-3 cache shared by some CPUs.
type LLC struct {
	ID    int
	CPUs  []int
	Size  string // as sysfs writes it, e.g. "32768K"
	Ways  int
	NoIDs bool // an old kernel without the id file
}

// AddLLC writes cache entries for every CPU of the cache: an L1d at index0
// and the L3 at index3.
func (t *Tree) AddLLC(l LLC) {
	t.llcIDs = append(t.llcIDs, l.ID)
	for _, cpu := range l.CPUs {
		base := fmt.Sprintf("sys/devices/system/cpu/cpu%d/cache", cpu)
		t.writeFiles(filepath.Join(base, "index0"), map[string]string{
			"level": "1", "type": "Data", "size": "48K", "ways_of_associativity": "12",
			"shared_cpu_list": fmt.Sprint(cpu), "id": fmt.Sprint(cpu),
		})
		files := map[string]string{
			"level": "3", "type": "Unified", "size": l.Size, "ways_of_associativity": fmt.Sprint(l.Ways),
			"shared_cpu_list": cpuList(l.CPUs),
		}
		if !l.NoIDs {
			files["id"] = fmt.Sprint(l.ID)
		}
		t.writeFiles(filepath.Join(base, "index3"), files)
	}
}

// AddDevNode makes a child device of a PCI function whose uevent names a
// /dev node, as drivers do (dfl-fme.0, xclmgmt, dri/renderD128).
func (t *Tree) AddDevNode(addr, child, devName string) {
	dir := filepath.Join(t.PCIDir(addr), child)
	t.write(filepath.Join(dir, "uevent"), "MAJOR=240\nMINOR=0\nDEVNAME="+devName+"\n")
}

// SetKernelConfig writes proc/config.gz with the given options set to y.
func (t *Tree) SetKernelConfig(options ...string) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	fmt.Fprintln(zw, "# generated by sysfstest")
	for _, o := range options {
		fmt.Fprintf(zw, "CONFIG_%s=y\n", o)
	}
	if err := zw.Close(); err != nil {
		panic(err)
	}
	t.mkdir("proc")
	if err := os.WriteFile(filepath.Join(t.Root, "proc/config.gz"), b.Bytes(), 0o644); err != nil {
		panic(err)
	}
}

// EnforcingKernel lists the options of a kernel that can enforce NIC
// bandwidth shares (TCX, HTB, IFB, macvlan) but has no fq or ipvlan, like
// the CI machine's.
var EnforcingKernel = []string{"BPF_SYSCALL", "NET_XGRESS", "NET_SCH_INGRESS", "NET_CLS_BPF", "NET_SCH_HTB", "IFB", "NET_ACT_MIRRED", "NET_CLS_U32", "MACVLAN", "VETH"}

// Write creates a file below Root (for cases the helpers do not cover,
// such as a malformed value).
func (t *Tree) Write(rel, content string) { t.write(rel, content) }

// Remove deletes a file below Root.
func (t *Tree) Remove(rel string) {
	if err := os.RemoveAll(filepath.Join(t.Root, rel)); err != nil {
		panic(err)
	}
}

func (t *Tree) writeFiles(dir string, files map[string]string) {
	for name, v := range files {
		t.write(filepath.Join(dir, name), v)
	}
}

func (t *Tree) mkdir(rel string) {
	if err := os.MkdirAll(filepath.Join(t.Root, rel), 0o755); err != nil {
		panic(err)
	}
}

func (t *Tree) write(rel, content string) {
	t.mkdir(filepath.Dir(rel))
	if !strings.HasSuffix(content, "\n") {
		content += "\n"
	}
	if err := os.WriteFile(filepath.Join(t.Root, rel), []byte(content), 0o644); err != nil {
		panic(err)
	}
}

// symlink makes rel point at target (both relative to Root) with a relative
// link, as sysfs does.
func (t *Tree) symlink(rel, target string) {
	t.mkdir(filepath.Dir(rel))
	link, err := filepath.Rel(filepath.Dir(rel), target)
	if err != nil {
		panic(err)
	}
	_ = os.Remove(filepath.Join(t.Root, rel))
	if err := os.Symlink(link, filepath.Join(t.Root, rel)); err != nil {
		panic(err)
	}
}

func cpuList(cpus []int) string {
	c := append([]int(nil), cpus...)
	sort.Ints(c)
	parts := make([]string, len(c))
	for i, v := range c {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, ",")
}
