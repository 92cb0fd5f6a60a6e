package discovery

import "github.com/carve-dra/carve/discovery/nvmlinfo"

// Inventory is everything discovery found on one node. It is plain data: the
// slices package turns it into ResourceSlices.
type Inventory struct {
	NICs   []NIC
	LLCs   []LLC
	FPGAs  []FPGA
	GPUs   []GPU
	Kernel KernelFeatures
	// NVML is what NVML reports of the GPUs; nil where it was not asked or
	// could not answer, and then NVMLError says why.
	NVML      *nvmlinfo.Inventory
	NVMLError string
	// GPUMemory is how each GPU's memory slices can be enforced, by UUID
	// (chosen by gpu/memslice at start); a GPU absent here is "none".
	GPUMemory map[string]GPUMemory
}

// GPUMemory is a GPU's memory enforcement tier (the memoryEnforcement
// attribute: dmem, mps-policed or none), why no stronger one, and its dmem
// region where the tier is dmem.
type GPUMemory struct {
	Enforcement string
	Reason      string
	Region      string
}

// PCIFunction is one PCI function as sysfs shows it.
type PCIFunction struct {
	// Address is the domain:bus:device.function, e.g. "0000:1a:00.0".
	Address  string
	VendorID string // "0x10de"
	DeviceID string // "0x2330"
	// Class is the 24-bit class code, e.g. "0x030200".
	Class       string
	VendorName  string // from pci.ids; empty when the database is missing
	ProductName string
	Driver      string
	// NUMANode is -1 where sysfs does not know it.
	NUMANode int
	// PCIeRoot is the root complex the function hangs off, e.g. "pci0000:00".
	PCIeRoot string
}

// ClassPrefix reports whether the function's class code starts with the
// given base class (and optionally subclass) hex digits, e.g. "12" or "0302".
func (f PCIFunction) ClassPrefix(prefix string) bool {
	return len(f.Class) >= 2+len(prefix) && f.Class[2:2+len(prefix)] == prefix
}

// NIC is a network interface from sys/class/net.
type NIC struct {
	Name string
	MAC  string
	MTU  int
	// SpeedMbps is the link speed in Mbit/s; 0 where the kernel does not
	// know it (virtio, a link that is down).
	SpeedMbps int64
	Driver    string
	OperState string
	Carrier   bool
	// Virtual is true for netdevs with no device behind them (veth,
	// bridges, lo).
	Virtual bool
	// PCI is nil for virtual netdevs.
	PCI *PCIFunction
	// DevPort distinguishes several netdevs on one PCI function.
	DevPort int
	// SRIOV is set on physical functions that can carry VFs.
	SRIOV *SRIOV
	// PhysFn is the PCI address of the parent PF when this NIC is a VF.
	PhysFn string
}

// LinkUsable reports whether the link can carry traffic now.
func (n NIC) LinkUsable() bool {
	return n.Carrier && (n.OperState == "up" || n.OperState == "unknown")
}

// SRIOV holds a physical function's VF counts.
type SRIOV struct {
	TotalVFs int
	NumVFs   int
}

// LLC is one level-3 cache instance.
type LLC struct {
	ID        int
	SizeBytes int64
	Ways      int
	// CPUs is the canonical CPU list, e.g. "0-15,32-47".
	CPUs string
	// Resctrl is set where the kernel's resctrl filesystem exposes L3
	// allocation, which is what makes a cache shareable.
	Resctrl *Resctrl
}

// Resctrl describes L3 cache allocation as resctrl reports it.
type Resctrl struct {
	// CBMMask is the full capacity bitmask; its popcount is the number of
	// allocatable ways.
	CBMMask     uint64
	MinCBMBits  int
	NumCLOSIDs  int
	ShareableBM uint64
	// MBA is set where resctrl also offers memory bandwidth allocation.
	MBA *MBA
}

// MBA describes memory bandwidth allocation as resctrl reports it: values
// of the MB schema from Min to Max (percent on Intel, where Max is 100) in
// steps of Gran.
type MBA struct {
	Min, Gran, Max int
}

// FPGA is an FPGA card: its first PCI function, with the device nodes its
// drivers made and the ids of what is loaded where sysfs shows them.
type FPGA struct {
	PCIFunction
	// Functions are the card's PCI functions (an XRT card's management
	// and user functions), the first one first.
	Functions []string
	// DevNodes are the /dev paths of the card's character devices.
	DevNodes []string
	// CompatID is the compat_id of the card's reconfigurable region (the
	// interface a partial bitstream must match); AFUID the afu_id of the
	// function loaded behind its port. Both are 32 lowercase hex digits,
	// "" where sysfs has none.
	CompatID string
	AFUID    string
}

// GPU is an NVIDIA GPU's PCI function. Discovery only records topology; a GPU
// is published once NVML confirms it.
type GPU struct {
	PCIFunction
}
