// Package llc prepares last-level caches for containers. A whole cache is
// described to the container (its id and CPUs). A share is a slice of the
// cache's ways, enforced by resctrl (Intel RDT, AMD PQoS): a group (CLOSID)
// per share holding a contiguous capacity bitmask no other share overlaps,
// which the runtime applies from the CDI spec's linux.intelRdt or, where it
// ignores that, carve's resctrl-attach hook (package prepare/hook).
//
// Discovery reads the caches (discovery/llc.go) and resctrl; the mask math
// is package discovery/cbm; the resctrl filesystem is behind an interface in
// package resctrl (groups, schemata, tasks), whose fixture,
// discovery/sysfstest.ResctrlFS, validates writes as the kernel does. The way
// allocator is alloc.go, its application apply.go, its recovery restore.go.
//
// # What is shareable
//
// Where resctrl is mounted with L3 allocation and has a CLOSID beyond the
// default group's, an LLC allows multiple allocations: a share consumes ways
// of one cache domain (or enough ways for its size, where that asks more),
// by default min_cbm_bits (or the node config's
// requestPolicies.llc.ways.default). The published ways is what shares can
// have: the mask's ways outside shareable_bits, less the min_cbm_bits the
// default group keeps (unless the shareable bits can hold it).
//
//	requests:
//	- name: cache
//	  exactly:
//	    deviceClassName: llc.carve.dev
//	    selectors:
//	    - cel: {expression: 'device.attributes["carve.dev"].cacheId == 0'}
//	    capacity:
//	      requests: {ways: "4", memoryBandwidth: "30"}
//
// Without resctrl an LLC is allocated whole: the container gets the cache id
// and its CPUs, to pin itself there, and nothing on the host changes.
//
// # Masks
//
// Each share gets a resctrl group carve-<hash of its share key> (its CLOSID)
// with a contiguous capacity bitmask that overlaps no other share of the
// domain, avoids shareable_bits (which I/O may evict) and has at least
// min_cbm_bits. Shares pack from the top of the mask; the default group
// (every unshared workload) gets the longest run of ways no share holds, so
// it shrinks as shares come and grows back as they go. A share's group holds
// the default group's ways in the other domains, so its tasks behave as
// unshared ones on another cache. A share that does not fit contiguously
// (the scheduler counts ways, not where they are) fails with the domain's
// masks in the message; so does one past num_closids.
//
// # Enforcement
//
// The CDI spec sets linux.intelRdt (closID the group, l3CacheSchema
// L3:<id>=<mask>, memBwSchema MB:<id>=<value> where a memoryBandwidth was
// asked) for the runtime to apply, and a createRuntime hook, `carve hook
// resctrl-attach`, that writes the container's process into the group's
// tasks for runtimes that ignore intelRdt (after one that applies it, it
// changes nothing). Which apply it: runc honours closID from v1.1.0 (checked
// in its source: earlier ones make a group named after the container, which
// the hook then overrides; Debian 12's runc 1.1.5 honours it); containerd
// passes CDI's intelRdt into the OCI spec from the CDI library v0.7 on, i.e.
// containerd 1.7.16 and 2.0.0 and later (2.4.2, which this project builds,
// vendors CDI v1.1.1). Older containerd cannot parse a spec of CDI version
// 0.7.0 at all. runc refuses a container with intelRdt on a node without
// resctrl; carve never writes it there.
//
// # Memory bandwidth
//
// Where resctrl offers MBA, LLCs also have a memoryBandwidth capacity: the
// default group's MB value (100, percent, on Intel), default 0 (no cap), in
// steps of bandwidth_gran. A share's value becomes its group's MB schema,
// raised to min_bandwidth; the scheduler keeps a domain's caps within the
// maximum.
//
// # State
//
// The masks are the shares' undo records in the checkpoint; at start the
// agent rebuilds its allocator from them (and, for a claim that crashed
// before its record, from its group's schemata), so masks survive restarts.
// Each share is also recorded on the node (<state-dir>/llc/<group>.json,
// written before its group is made): a lost or corrupt checkpoint is
// rebuilt from those records, whose groups keep their ways, and the
// kubelet's unprepare of a claim the checkpoint lost removes its groups by
// them (UnprepareClaim, a prepare.ClaimCleaner), as netdev's attach specs
// do for NIC shares.
// Unprepare removes the group (the kernel returns its tasks to the default
// group) and gives the ways back. The container sees CARVE_<REQUEST>_CACHE_ID,
// _CPUS, _CACHE_WAYS, _CACHE_MASK and _CLOS_ID.
//
// # Limits
//
// carve owns the L3 masks of the default group on nodes where it offers
// shares. A container can be in one resctrl group: two LLC shares in one
// container leave it in the last one's. resctrl mounted with cdp
// (L3CODE/L3DATA) is not offered for sharing. resctrl mounted after the agent
// started needs an agent restart (the chart's hostRootPropagation: None shows
// the host's mounts as they were when the agent started).
//
// # Checked only against fixtures
//
// The project's machine has a kernel without resctrl, so this path was tested
// against fixture trees and a fake resctrl that validates writes as the
// kernel does; the real-resctrl tests skip there saying so. On real hardware
// still to check: runc placing the container in the share's group and the
// hook's write to tasks under the runtime's mount namespace; the kernel's
// initial masks for new groups, its schemata formatting with CDP or
// mba_MBps, and AMD's MB units (not percent); and cache isolation actually
// measured (e.g. with pqos or a cache-thrashing neighbour).
package llc
