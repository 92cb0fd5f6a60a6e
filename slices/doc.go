// Package slices turns a discovery.Inventory and a NodeConfig into the
// resource.k8s.io/v1 ResourceSlices of one node's pool. It is pure: no I/O,
// so every rule of the contract can be tested exhaustively.
//
// The contract, which checks outside this repository rely on:
//   - every device has the string attribute "kind": nic, llc, fpga, gpu;
//   - PCI-backed devices have "pciAddress", the standard
//     resource.kubernetes.io/pcieRoot and, where known, "numaNode";
//   - NICs have "ifName" and "mac", and capacities "egressBandwidth" and
//     "ingressBandwidth" in bits per second; they allow multiple allocations
//     with a request policy only where this node can enforce the share;
//   - LLCs have "cacheId" and "cpus", and capacities "ways" and "size";
//     they are shareable only where resctrl offers L3 allocation, with
//     "memoryBandwidth" too where it offers MBA;
//   - FPGAs have "vendorID" and "deviceID", and "compatID" and "afuID"
//     (32 lowercase hex digits) where sysfs shows what is loaded.
package slices
