// Package snapshot captures what carve's discovery reads on a node (the
// sysfs subset, the kernel config, pci.ids, the NVML inventory in the replay
// format and the node config) into a tar.gz, and unpacks one so that
// discovery reproduces that node on another machine.
//
// `carve snapshot -o FILE.tar.gz` captures the sysfs subset (PCI functions
// and their links, netdevs, CPU caches, resctrl), the kernel config, pci.ids,
// the NVML inventory in the replay format (package nvmlinfo, with the real
// migProfiles) and, with --config, the node config. `carve discover --from
// FILE.tar.gz` reproduces that node on another machine (its NVML from the
// snapshot, its node config unless --config is given). Attach a snapshot to
// a bug report.
package snapshot
