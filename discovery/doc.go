// Package discovery builds an Inventory of the node's hardware (NICs, LLCs,
// FPGAs and the PCI functions of GPUs) and of the kernel features that
// enforcing shares needs, by reading sysfs and procfs under a root path. The
// root is "/" in production and a fixture tree in tests, so the same code
// serves both. Discovery only reads; it never writes, and it knows nothing of
// how the inventory is published (package slices).
//
// Where each kind is read: nic.go (netdevs), llc.go (CPU caches and
// resctrl), fpga.go (FPGA cards and their device nodes), pci.go (PCI
// functions, GPUs among them: class 0x03, vendor 0x10de), kernel.go (kernel
// features). The GPUs' NVML side is package gpu, into the plain inventory of
// package nvmlinfo.
//
// # Kernel features
//
// Where the root is the running kernel's (its proc/sys/kernel/random/boot_id
// is the process's own: the agent with --root=/host, `carve discover` on the
// node) what can enforce a share is probed once per process
// (netdev/kernelprobe, about 30 ms): cilium/ebpf loads a sched_cls program
// and attaches it through TCX and cls_bpf, and HTB, fq, clsact, u32, mirred,
// IFB, macvlan and ipvlan are created on a throwaway veth in a scratch
// network namespace, gone when the probe returns; resctrl is read from
// /proc/filesystems. Many production kernels have no config file, and a
// config says what was built, not what loads. Under a fixture or a snapshot
// (--root, --from), where the kernel described is not the running one, and
// where the probe fails (not root), the config (/proc/config.gz or
// /boot/config-<release>) is read instead, again only when it changes.
//
// # Names from pci.ids
//
// Vendor and product names are those ghw gave, from pci.ids as pcidb finds
// it ($PCIDB_PATH, else usr/share/{hwdata,misc}/pci.ids[.gz] below /, the
// agent image's, not below --root), but ghw is no longer asked (pciids.go):
// ghw.PCI read every function again and had pcidb parse all of pci.ids on
// each call, half of a first discovery's CPU and 20 of its 25 MB on the
// large test node, and ghw v0.26 ignores a database handed to it. Instead
// pcidb, ghw's own parser, gets pci.ids cut down, by a scan of its lines,
// to the blocks of the vendors the node has, without subsystems and
// classes (a few hundred lines, through a memfd: the image has no writable
// directory); TestPCINamesAsGhw checks the names against ghw's. Nothing is
// kept on disk, so every process's first discovery pays the scan, a few
// ms; a Scanner reads pci.ids again only where its inode, size or time
// changed, where its last read gave no names, or where a function appeared
// whose vendor and device IDs it did not name. Discovery reads each PCI
// function's modalias, numa_node and two links, and each netdev's
// attributes, relative to its directory and on as many goroutines as the
// process has CPUs (at most 8); a netdev whose device is a PCI function
// takes that function's driver, and an L3 is read under the first CPU
// that lists it, not under each.
//
// # Rescans (Scanner)
//
// The agent rediscovers on every link event and every --rescan-interval, and
// keeps what the last discovery read (Scanner): a link event names its link,
// and only that netdev's files are read again; every other netdev and every
// PCI function is taken as last read where its entry in sys/class/net or
// sys/bus/pci/devices is the same (name and inode: sysfs gives a device made
// again a new inode), with each PF's sriov_numvfs and each function's driver
// link read again. The periodic rescan, and a rescan after the link
// subscription was lost, read every netdev. Events of carve's own links (cv…,
// cvifb…), and those that change nothing discovery reads (a parent told of a
// child added or removed), do not start a rediscovery; where the inventory
// found is the last one, the slices are not built again.
//
// Measured on the large test node (8 GPUs, 16 NICs × 128 VFs, 2 LLCs, 4
// FPGAs; BenchmarkDiscoverLarge, BenchmarkRescanLarge in cmd/carve/app), on
// the project's 2-vCPU VM shared with other engineers' builds (load average
// 8–9), fixtures on tmpfs as in make bench, before and after pci.ids was
// cut to the node's vendors, one run each: a first discovery in a process
// 583 → 294 ms/op (472 → 248 ms CPU), 25.3 → 5.7 MB/op, against a goal of
// 50 ms and 10 MB: memory met, time missed. What is left is reading sysfs,
// some 72,000 system calls (open, read, close of each attribute, readlink;
// a periodic rescan, which reads every netdev again, costs nearly as much:
// 201 ms/op, 170 ms CPU), about 3 µs each on this loaded VM, which two CPUs
// cannot overlap while others keep them busy. A rescan after a link event
// / after a VF count change (what the agent does on every event) 50 / 50
// ms/op, 2.4 MB/op; one that has to read pci.ids again (new device IDs) 53
// ms/op. Process start to slices printed (BenchmarkProcessStartToSlices,
// -o json): 850 → 459 ms (611 → 346 ms CPU; `carve --help` 31 ms in the
// same run), goal 150 ms, missed for the same reason plus encoding 2070
// devices as JSON (about 60 ms of CPU). The run's other figures, memory
// among them, are in deploy/README.md.
//
// Later, in one sitting at load 6–7 (another engineer's builds and local
// cluster), medians of three, before → after: cold 360 → 252 ms/op (CPU
// 206 → 217 ms, noise; profiles of 30 runs at lower load gave 235 → 189
// ms), 5.7 → 5.0 MB/op; process start to slices 526 → 392 ms (CPU 430 →
// 327 ms; `carve --help` 47 ms), the List's items now marshaled in
// parallel (package slices). Both goals are still missed, and discovery
// cannot meet its goal on this VM by doing less of what it does now: its
// time is the kernel's path walks, not system call entry (getppid costs
// 0.28 µs here, an fstatat of one file in a directory already open 2.2
// µs, open, read and close of a tmpfs attribute 5.6 µs, sysfs 10 µs; the
// VM is nested, nested_pvm=1), and the large node has some 16,600
// attribute files (six per netdev, two per PCI function) and 8,300 links
// to read: some 110 ms of CPU, 55 ms on two idle CPUs. io_uring would save
// only the entries. Fewer files per device would: on a real node the
// netdevs' attributes could come from one netlink dump where the root is
// the running kernel's, which would not change the fixture benchmark.
//
// # Below
//
// cbm (resctrl capacity bitmask math), nvmlinfo (the NVML inventory and
// replay format) and nvmlinfo/nvmltest (the test GPU nodes), snapshot
// (`carve snapshot`, `carve discover --from`), sysfstest (fixture trees,
// including a resctrl that validates writes as the kernel does).
package discovery
