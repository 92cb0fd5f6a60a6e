// Package slices turns a discovery.Inventory (and the GPUs' nvmlinfo
// inventory) and a NodeConfig into the resource.k8s.io/v1 ResourceSlices of
// one node's pool. It is pure: no I/O, so every rule of the contract can be
// tested exhaustively. `carve discover` prints the pool exactly as the agent
// publishes it. Attributes are in the driver's domain (carve.dev by default,
// the NodeConfig's driverName).
//
// # Pool and names
//
// One pool per node, named after the node, split into slices of at most 128
// devices. Device names derive from what is stable across reboots: the PCI
// address (nic-0000-17-00-0, fpga-0000-3b-00-0), the cache id (llc-0), or
// the interface name for virtual NICs (nic-veth0); GPUs are gpu-<pci
// address>, MIG placements mig-<pci address>-<profile>-<start>
// (mig-0000-19-00-0-3g-40gb-4). What cannot be offered in full (a link of
// unknown speed, a kernel that cannot shape, no resctrl, no NVML) is logged
// on stderr, never silently dropped.
//
// # The contract
//
// Checks outside this repository rely on these names:
//
//   - Every device has the string attribute "kind": nic, llc, fpga, gpu or
//     mig.
//   - PCI-backed devices have "pciAddress", the standard
//     resource.kubernetes.io/pcieRoot, "numaNode" and
//     resource.kubernetes.io/numaNode where known, and
//     "vendorName"/"productName" where pci.ids knows them.
//   - NICs have "ifName", "mac", "mtu", "driver", "virtual",
//     "sriovTotalVFs"/"sriovNumVFs" on PFs and "sriovPhysFn" on VFs, and
//     capacities "egressBandwidth" and "ingressBandwidth" in bits per second,
//     from the link speed or the node config. They allow multiple
//     allocations with a request policy only where the kernel can enforce
//     shares and the link is up, and then have the capacity "shares" too:
//     how many shares the NIC can hold at once, of which every allocation
//     consumes exactly 1 (see Shares below).
//   - LLCs have "cacheId", "cpus" and "resctrl", and capacities "ways" and
//     "size", with "memoryBandwidth" too where resctrl offers MBA. They are
//     shareable only where resctrl has L3 allocation (package prepare/llc).
//   - FPGAs have "vendorID", "deviceID" and "driver", and "compatID" and
//     "afuID" (32 lowercase hex digits) where sysfs shows what is loaded.
//   - GPUs with MIG off (kind gpu) have "uuid", "productName" (NVML's),
//     "architecture" (hopper, ampere, ...), "cudaComputeCapability"
//     (a version, 9.0.0), "driverVersion" (a string, 580.159.04),
//     "cudaDriverVersion" (a version, 13.0.0), "migCapable" and
//     "memoryEnforcement" (dmem, mps-policed or none), and capacity "memory"
//     in bytes. They are shared in memory slices only where
//     memoryEnforcement is not none and the node config has
//     requestPolicies.gpu.memory (package gpu/memslice).
//   - MIG placements (kind mig) have "profile" (NVML's name, 3g.40gb),
//     "placementStart", "placementSize" (NVML's units), "parentUUID", and the
//     parent's "productName", "architecture", versions and PCI topology, and
//     capacities "memory" and "multiprocessors"; they consume counters of the
//     parent's counter set.
//
// # GPUs
//
// GPUs are found by PCI (class 0x03, vendor 0x10de) and published as NVML
// reports them, joined to their PCI function by bus ID (NVML's 8-digit domain
// 00000000:19:00.0 is discovery's 0000:19:00.0), so they get pciAddress,
// resource.kubernetes.io/pcieRoot and numaNode (none where sysfs says -1) and
// a claim can ask for a GPU and a NIC on one PCIe root. A GPU NVML reports
// that PCI discovery did not find is published without topology; a PCI GPU
// NVML does not know is not published; both are noted.
//
// A GPU with MIG off is one device (a MIG-capable one says migCapable:
// true). A GPU with MIG on publishes every GPU-instance placement NVML
// reports (GetGpuInstancePossiblePlacements for each profile
// GetGpuInstanceProfileInfo knows) as a partitionable device (KEP-4815).
// Nothing comes from a built-in table: a real H100 on driver 580 spans 8
// memory slices (7g.80gb spans 8, 3g.40gb 4, 1g.20gb 2 with 4 placements),
// which is not go-nvml's mock table. A placement that overlaps a GPU
// instance which exists and which no claim made (by hand, or another tool;
// the agent tells which through MIGOwned, from its checkpoint) is left out,
// with a notice: the driver would refuse it.
//
// # MIG counters
//
// Each MIG-enabled GPU has one counter set, named as the GPU
// (gpu-0000-19-00-0), holding one counter per memory slice of its placement
// space (memory-slice-0 ... memory-slice-7, capacity 1 each), plus memory
// (bytes), multiprocessors and, where a profile holds any, media-extensions
// (NVML's optical-flow accelerator count: an H100 has one, held by its
// 1g.10gb+me and its 7g.80gb). A MIG device consumes 1 of every slice its
// placement spans, its own memory and multiprocessors, and its media
// extensions. Two placements that overlap can therefore never be allocated
// together, nor two 1g.10gb+me (the driver refuses the second), and any other
// two can; memory and multiprocessors hold at least what any set of disjoint
// placements needs, so they never refuse a combination the slices allow. In
// resource.k8s.io/v1 a slice holds either counter sets (at most 8) or
// devices, so the counter sets go in their own slice of the pool, and a slice
// of devices that consume counters holds at most 64: an 8 x H100 node with
// MIG on publishes 1 counter slice and 4 device slices (200 devices).
//
// # Shares
//
// A NIC's "shares" capacity is the smallest of:
//
//   - its part of the BPF classifier, which holds 2048 shares for the whole
//     node (DefaultClassifierShares; the agent passes its loaded
//     classifier's, ClassifierShares, which is the same: maps of 4096
//     entries, a share taking two of shares and share_stats, one a
//     direction, and one of share_netns). The classifier is divided among
//     the NICs this kernel could share, whose bandwidth is known, up or
//     down (a down NIC's shares may still hold entries): each gets
//     floor(2048 / NICs), the first ones in the inventory's order one more
//     until the remainder is spent, so that together they never hold more
//     than the classifier. A NIC that gets none (more NICs than 2048) is
//     published whole, and noted;
//   - the HTB classes a parent can hand out, a block of 16 class minors a
//     share and direction (its class and its flow children): 4094
//     (HTBClassesPerParent, class minors 0x10 to 0xffef);
//   - the node config's netdev.maxSharesPerNIC, 256 by default.
//
// Its request policy is default 1, valid range [1, 1]: a claim that does
// not ask consumes 1, one that asks for more fits no NIC, and the scheduler
// sums what the allocations consume (KEP-5075), so a NIC full of small
// shares refuses the next one rather than one tenant's many 1 Mbit/s shares
// filling the node's classifier. The agent refuses, at prepare, a share past
// the limit too (package netdev). With two NICs of known bandwidth, each
// gets min(1024, 4094, 256) = 256.
//
// # Request policies
//
// Without a policy in the node config (package nodeconfig), a NIC share
// defaults to 1% of the link in 1 Mbit/s steps, and an LLC share to
// resctrl's minimum number of ways; a GPU without requestPolicies.gpu.memory
// is published whole-device only.
package slices
