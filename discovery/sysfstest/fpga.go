package sysfstest

import (
	"fmt"
	"path/filepath"
)

// XRT describes an AMD/Xilinx Alveo card run by XRT: a management function
// bound to xclmgmt and a user function bound to xocl, in one slot.
type XRT struct {
	Mgmt, User string // PCI addresses
	// Instance numbers the management node (xclmgmt<Instance>); Render
	// the user function's DRM render node (renderD<Render>).
	Instance, Render int
	NUMANode         int
}

// AddXRT lays the card out as XRT does: the management node as a class
// device below the management function, an xfpga subdevice node below it,
// and the DRM card and render nodes below the user function; and, as udev
// would, their /dev entries (plain files).
func (t *Tree) AddXRT(x XRT) {
	pci := PCI{Vendor: VendorXilinx, Device: DeviceAlveoU250, Class: ClassProcAccel, NUMANode: x.NUMANode, Driver: "xclmgmt"}
	mgmt := t.AddPCI(x.Mgmt, pci)
	pci.Driver, pci.Device = "xocl", DeviceAlveoU250+1
	user := t.AddPCI(x.User, pci)
	mgmtNode := fmt.Sprintf("xclmgmt%d", x.Instance)
	t.addCharDev(filepath.Join(mgmt, "xrt_mgmt", mgmtNode), mgmtNode, "", 240, 0)
	flash := fmt.Sprintf("flash.m%d.0", x.Instance)
	t.addCharDev(filepath.Join(mgmt, flash, "xfpga", flash), "xfpga/"+flash, "", 241, 0)
	t.addCharDev(filepath.Join(user, "drm", fmt.Sprintf("card%d", x.Render-127)), fmt.Sprintf("dri/card%d", x.Render-127), "", 226, x.Render-127)
	t.addCharDev(filepath.Join(user, "drm", fmt.Sprintf("renderD%d", x.Render)), fmt.Sprintf("dri/renderD%d", x.Render), "", 226, x.Render)
}

// DFL describes an Intel FPGA card run by the kernel's DFL drivers.
type DFL struct {
	Address string
	// ID numbers its FME and port (dfl-fme.<ID>, dfl-port.<ID>).
	ID       int
	NUMANode int
	// CompatID is the FME region's compat_id, AFUID the port's afu_id;
	// empty leaves the file out.
	CompatID, AFUID string
}

// AddDFL lays the card out as the DFL drivers do: a container region below
// the PCI function (whose compat_id the kernel refuses to read, so it is
// absent here), the FME and the port below it bound to dfl-fme and
// dfl-afu, the FME's PR region with its compat_id, and a flash device
// (mtd) below the FME that is the host's, not a workload's; and their /dev
// entries (plain files).
func (t *Tree) AddDFL(d DFL) {
	dir := t.AddPCI(d.Address, PCI{Vendor: VendorIntel, Device: DeviceIntelN3000, Class: ClassProcAccel, NUMANode: d.NUMANode, Driver: "dfl-pci"})
	region := filepath.Join(dir, "fpga_region", fmt.Sprintf("region%d", 2*d.ID))
	t.mkdir(region)
	fme := filepath.Join(region, fmt.Sprintf("dfl-fme.%d", d.ID))
	t.addCharDev(fme, fmt.Sprintf("dfl-fme.%d", d.ID), "dfl-fme", 239, 2*d.ID)
	if d.CompatID != "" {
		t.write(filepath.Join(fme, fmt.Sprintf("dfl-fme-region.%d", d.ID), "fpga_region", fmt.Sprintf("region%d", 2*d.ID+1), "compat_id"), d.CompatID)
	}
	t.addCharDev(filepath.Join(fme, fmt.Sprintf("dfl_dev.%d", d.ID), "mtd", fmt.Sprintf("mtd%d", d.ID)), fmt.Sprintf("mtd%d", d.ID), "", 90, 2*d.ID)
	port := filepath.Join(region, fmt.Sprintf("dfl-port.%d", d.ID))
	t.addCharDev(port, fmt.Sprintf("dfl-port.%d", d.ID), "dfl-afu", 239, 2*d.ID+1)
	if d.AFUID != "" {
		t.write(filepath.Join(port, "afu_id"), d.AFUID)
	}
}

// addCharDev makes a device directory with its uevent and dev files, bound
// to driver where one is given, and its node under dev/.
func (t *Tree) addCharDev(dir, devName, driver string, major, minor int) {
	t.write(filepath.Join(dir, "uevent"), fmt.Sprintf("MAJOR=%d\nMINOR=%d\nDEVNAME=%s\n", major, minor, devName))
	t.write(filepath.Join(dir, "dev"), fmt.Sprintf("%d:%d", major, minor))
	if driver != "" {
		t.mkdir(filepath.Join("sys/bus/platform/drivers", driver))
		t.symlink(filepath.Join(dir, "driver"), filepath.Join("sys/bus/platform/drivers", driver))
	}
	t.write(filepath.Join("dev", devName), "")
}
