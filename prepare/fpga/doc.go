// Package fpga prepares whole FPGA cards for containers: their device nodes,
// through CDI. A card is never shared.
//
// # Discovery
//
// Package discovery (discovery/fpga.go) finds the cards and their nodes
// through sysfs, never by guessing names:
//
//   - AMD/Xilinx XRT: the management function (xclmgmt) and the user function
//     (xocl) of one slot are one device, named after the first function; the
//     container gets every node their devices' uevents name
//     (/dev/xclmgmt<N>, /dev/xfpga/*, /dev/dri/renderD<N> and card<N>).
//   - Intel DFL (dfl-pci): the FME and port nodes (dfl-fme.N, dfl-port.N),
//     recognized by the drivers their devices are bound to (dfl-fme,
//     dfl-afu); the card's flash and other children stay the host's.
//
// What is loaded is published where sysfs shows it: compatID (the FME
// region's compat_id, the interface a partial bitstream must match) and
// afuID (the port's afu_id), each 32 lowercase hex digits. A claim picks the
// function it needs; use optional chaining, since cards without the file
// have no such attribute (a missing key is a CEL error that fails the whole
// selection):
//
//	requests:
//	- name: fpga
//	  exactly:
//	    deviceClassName: fpga.carve.dev
//	    selectors:
//	    - cel:
//	        expression: device.attributes["carve.dev"].?afuID.orValue("") == "d8424dc4a4a3c413f89e433683f9040b"
//
// # Prepare
//
// The container gets the card's device nodes through CDI (deviceNodes, named
// as the host sees them; the agent looks them up under --root, so /host/dev/x
// in its pod is /dev/x in the spec), and CARVE_<REQUEST>_PCI_ADDRESS and
// _DEVICE_NODES. --fpga-root (the chart's fpgaRoot) reads the cards from a
// fixture tree instead, for tests; the CDI spec still names the nodes as
// /dev/<name>, which must exist on the host.
//
// # Checked only against fixtures
//
// The project's machine has no FPGA, so this path was tested against
// fixture trees (discovery/sysfstest) laid out after the kernel's and XRT's
// documentation. On real hardware still to check: XRT's class directory
// names and whether xocl's user function exposes more nodes than the DRM
// ones; that DFL's afu_id and FME region compat_id read as 32 hex digits on
// the kernel in use; that a container given the nodes can open them
// (permissions, IOMMU groups for DMA).
package fpga
