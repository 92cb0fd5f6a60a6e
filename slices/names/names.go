// Package names holds the names carve publishes and reads back: the values
// of the "kind" attribute, and the attribute and capacity names of its
// ResourceSlices. They are a contract (DeviceClass and claim CEL, the
// scheduler plugins, `carve shares`, the preparers' consumed capacity),
// so each is written once, here. The constants are untyped: they serve as
// resourceapi.QualifiedName and as plain strings alike. This package
// imports nothing, so that the scheduler module can use it too.
package names

// Kinds, the values of the "kind" attribute.
const (
	KindNIC  = "nic"
	KindLLC  = "llc"
	KindFPGA = "fpga"
	KindGPU  = "gpu"
)

// KindMIG is the kind of a MIG partition of a GPU.
const KindMIG = "mig"

// Attribute and capacity names of the contract.
const (
	AttrKind       = "kind"
	AttrPCIAddress = "pciAddress"
	AttrNUMANode   = "numaNode"
	AttrIfName     = "ifName"
	AttrMAC        = "mac"
	AttrCacheID    = "cacheId"
	AttrCPUs       = "cpus"
	AttrVendorID   = "vendorID"
	AttrDeviceID   = "deviceID"
	// AttrCompatID is the compat_id of an FPGA's reconfigurable region,
	// AttrAFUID the afu_id of the function loaded behind its port.
	AttrCompatID = "compatID"
	AttrAFUID    = "afuID"

	CapEgressBandwidth  = "egressBandwidth"
	CapIngressBandwidth = "ingressBandwidth"
	// CapShares is how many shares a NIC can hold at once: every
	// allocation of a shareable NIC consumes exactly 1 of it.
	CapShares = "shares"
	CapWays   = "ways"
	CapSize   = "size"
	// CapMemoryBandwidth is an LLC share's memory bandwidth cap, in the
	// unit of resctrl's MB schema (percent on Intel).
	CapMemoryBandwidth = "memoryBandwidth"
)

// GPU attribute and capacity names of the contract.
const (
	AttrUUID                  = "uuid"
	AttrProductName           = "productName"
	AttrArchitecture          = "architecture"
	AttrCUDAComputeCapability = "cudaComputeCapability"
	AttrDriverVersion         = "driverVersion"
	AttrCUDADriverVersion     = "cudaDriverVersion"
	AttrMIGCapable            = "migCapable"
	AttrProfile               = "profile"
	AttrPlacementStart        = "placementStart"
	AttrPlacementSize         = "placementSize"
	AttrParentUUID            = "parentUUID"
	// AttrMemoryEnforcement says how memory slices of a GPU are held:
	// "dmem", "mps-policed" or "none" (whole-device only).
	AttrMemoryEnforcement = "memoryEnforcement"
	// AttrPersistenceMode is NVML's persistence mode of the GPU (of the
	// parent, on a MIG device); absent where NVML did not answer it.
	AttrPersistenceMode = "persistenceMode"

	CapMemory          = "memory"
	CapMultiprocessors = "multiprocessors"
)
