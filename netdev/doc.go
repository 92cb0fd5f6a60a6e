// Package netdev prepares network claims: a share of a parent NIC given to a
// pod as its own macvlan or ipvlan interface, with its bandwidth held to the
// allocation in both directions. It is, with bpf, the only package that
// calls netlink; the node's network namespace is passed in explicitly.
// NICPreparer is the kind's prepare.Preparer; discovery finds the NICs
// (discovery/nic.go) and package slices publishes them. Measured figures are
// in MEASURED.md beside this file.
//
// # The pod's interface
//
// A NIC allocation becomes the pod's own interface: a macvlan (vepa by
// default, private, or bridge for unlimited shares; never passthru) or
// ipvlan (l2, l3, l3s) child of the parent NIC, named cv<hash of
// claim/request/share> in carve's records, with a MAC derived the same way,
// so that everything can be found and undone from the allocation alone. At
// prepare time carve makes its classes, classifier entries and attach spec
// (and asks the kernel once per kind whether it can make such a child); the
// hook makes the interface itself, in the pod's namespace, where it costs
// no RCU grace period (a move there waited 24 ms p50; an older agent's
// prepare made it on the node, and the hook moves such a one). The claim's CDI spec carries a createRuntime hook,
// `carve-hook netns-attach` (the runtime hooks are package prepare/hook,
// built alone into cmd/carve-hook, a small static binary the agent installs
// in its state directory; `carve hook netns-attach` where the image lacks
// it), which the container runtime runs on the host for every container of
// the pod (it is idempotent): it makes the interface in the pod's
// namespace, named net1 by default, sets its MTU, addresses and routes
// and brings it up. The interface name, addresses and MAC are reported in the
// claim's status.devices (KEP-4817 network data); the container also sees
// them as CARVE_<REQUEST>_INTERFACE, _ADDRESSES, _MAC and _PARENT.
//
//	apiVersion: carve.dev/v1alpha1
//	kind: NetworkConfig
//	mode: macvlan              # or ipvlan
//	macvlanMode: vepa          # private, bridge (not with a bandwidth limit), passthru; ipvlanMode: l2, l3, l3s
//	interfaceName: net1
//	mtu: 1500                  # at most the parent's
//	vlan: 100                  # optional: the share sits on a VLAN of the parent
//	addresses: ["10.0.0.5/24"] # static, IPv4 or IPv6
//	pools: [v4]                # or one address from each named pool of the node config
//	allowedPools: [v4, v4b]    # class only: the pools its claims may name besides pools
//	routes:
//	- {destination: 10.1.0.0/16, gateway: 10.0.0.1}
//	- {destination: default, gateway: 10.0.0.1}
//	maxCeiling: link           # class only: its claims may borrow idle capacity, up to this
//	egressCeiling: 1G          # how far this share borrows (default: maxCeiling); ingressCeiling too
//	openFamilies: [IPv6]       # class only: a family carve gives no address in is open (SLAAC, DHCP)
//	ethertypes: ["0x88F7"]     # class only: more than IPv4, ARP and IPv6 its pods may send (PTP here)
//	allowRouterAdvertisements: true # class only: its pods may send IPv6 RAs and redirects
//
// Address pools are in the node config (netdev.pools: [{name, cidr,
// gateway}]); an address is recorded in the claim's checkpoint record and
// freed on unprepare, and an exhausted pool fails the claim saying so. Who may
// set which field is in the security model below.
//
// A NIC holds at most its "shares" capacity (package slices: its part of the
// classifier, at most the node config's netdev.maxSharesPerNIC, 256 by
// default), which the scheduler keeps to; prepare refuses a share past it
// too, naming the NIC, its limit and how many it holds, before anything of
// the share is made (held.go).
//
// # Enforcement
//
// Each share's egressBandwidth and ingressBandwidth (its consumed capacity)
// get an HTB class of that rate, with a burst of about 8 ms of traffic
// (netlink's default burst loses ~10% at 1G). The rate is a hard cap, or,
// where the share's DeviceClass sets maxCeiling, the share's floor: it
// borrows the link's idle capacity up to its ceiling (ceiling.go).
//
//   - Egress: the classifier (package bpf) at the head of the parent's TCX
//     egress finds each frame's share and redirects the frames of limited
//     shares to the parent's egress shaper: a veth pair
//     cveg<ifindex>/cveg<ifindex>r made with the parent's first limited share
//     and removed with its last. HTB on cveg<ifindex> holds each share to its
//     rate; a program on the ingress of its peer sends the frames back out of
//     the parent. The parent's own root qdisc (noqueue on a veth, mq on a
//     multi-queue NIC) is never carve's, so the node's traffic, other pods'
//     and unlimited shares' take no lock of carve's: only the program. An IFB
//     cannot be the shaper: it drops frames a BPF program redirects to it
//     from a local socket (their skb_iif is 0; the pod's ARP never got out).
//     Frames keep their socket through the veth, so TCP small queues still
//     hold a sender back while its frames wait in the share's class, and GSO
//     super-packets cross it whole.
//   - Ingress: frames whose destination MAC is a share's are redirected to an
//     IFB cvifb<ifindex>, whose HTB shapes them. Shaping (a queue) instead of
//     policing (drops) holds TCP to its rate without the ~200 ms bursts a
//     policer needs. A flow-isolated share's pure TCP ACKs (no payload; of
//     the flags only ACK, ECE and CWR) skip the IFB, counted as the share's,
//     up to a sixteenth of its ingress rate (bpf/acks.h): the trip through
//     the IFB delayed the acknowledgements of the pods' own sending, and a
//     hundred saturated BBR senders fell short of their egress rates.
//   - Every class has a bounded queue: fq_codel where the kernel has it.
//     Else (flows.go) the share's class has children: one for its sparse
//     flows (a ping, DNS, an RPC: served first, and assured a sixteenth of
//     the share's rate of its own, so that they never wait behind the
//     share's own bulk transfer, nor behind the share's tokens a bulk
//     super-packet spent) and eight for its bulk flows, a child per flow
//     while one is free, served round-robin a quantum at a time. CoDel
//     keeps the bulk children's queues near a 5 ms target (more with many
//     busy children at a low rate, or super-packets: bpf/aqm.h), measuring
//     each frame's sojourn in the first program after the queue
//     (return_shaped on egress; share_dequeued on the share's interface in
//     the pod, which the runtime hook attaches). Frames cross the children
//     whole, GSO and GRO super-packets included: splitting them into
//     frames, as carve did before, cost the node three times the CPU per
//     shaped Gbit/s, and a hundred 10M shares saturated at once no longer
//     held their rates (issue 37, MEASURED.md). A pod's own super-packets
//     are kept to about 4 ms of its share's egress rate (gso.go): HTB lets
//     each out as one burst, which BBR took for a faster path. Every leaf is a bfifo of
//     50 ms of the share's rate at most (never under a 64 KiB super-packet
//     and a frame: 54 ms at 10M). HTB's default leaf, 1000 frames, held
//     1.1 s at 10M (BenchmarkLatencyUnderLoad, MEASURED.md).
//     A share takes an aligned block of 16 class minors, its class's first.
//     An unprepared share's block is parked, not deleted, and the next share
//     on the device takes it over by class changes (park.go): the kernel
//     walks every class of the HTB on each class added or deleted.
//     `carve shares` shows each share's queue discipline and its AQM's
//     drops and CE marks.
//   - Traffic of no limited share never enters a qdisc of carve's, and keeps
//     its own skb->priority.
//   - carve leaves the parent's root qdisc alone, whatever it is: an
//     operator's cake, mqprio, prio, tbf... stays, and shaped frames pass
//     through it too on their way out.
//   - Per-share counters are served as carve_share_bytes_total,
//     carve_share_packets_total (both from the pinned maps) and
//     carve_share_drops_total (from the HTB classes of the devices that hold
//     shares only, the parents' egress shapers and IFBs, on a netlink socket
//     of the metrics' own, so a scrape never dumps every link's classes: that
//     was 2064 dumps on a node with 2048 VFs), with claim, share_id and
//     direction labels.
//   - ipvlan shares are told apart by address (package bpf): their addresses
//     are the DeviceClass's static ones and those from the node config's
//     pools; an ipvlan share with a limit and no address is refused at
//     prepare. ipvlan children are made in vepa (ipvlan keeps one mode and
//     one set of flags per parent, set by the child made last), so that a
//     share's frames to another child of the parent go through the parent's
//     shaper. The project's kernel has no ipvlan: TestIPVlanShare runs
//     in make vmtest's 6.12 and 6.1 guests (deploy/vmtest), and here the
//     address path is exercised on macvlan children keyed the same way
//     (TestAddressKeyedShareHoldsItsRate).
//   - Unprepare removes the share's classifier entries (address entries
//     included, found by the share's MAC, so also without a record),
//     classes, interface, addresses and hook spec, and the parent's egress
//     shaper and IFB once no share is left; at start the agent removes
//     shapers and IFBs whose parent is gone.
//
// Egress is not paced by EDT with fq, even where the kernel has sch_fq: that
// needs fq at the parent's root, which every other sender on the parent would
// pay for. The edt_egress program is still in the classifier, with its tests;
// shares an older carve paced that way keep their rate until unprepared, and
// the fq root it left stays.
//
// # Teardown off the kubelet's path
//
// Unprepare of a network share releases it at once: its classifier entries
// are deleted (from the next frame on its traffic is neither charged nor
// shaped), its pool addresses are free, and its attach spec is set aside. Its
// HTB classes (parked for the next share on the device, not deleted:
// park.go), the parent's HTB and IFB once no share is left, its interface
// (if still in the node's namespace: one that moved into a pod went with the
// pod's namespace and is not deleted twice) and the spec are queued, on disk
// (<state-dir>/netdev/reaper/, a checkpoint of this boot), for a reaper that
// works in batches after the answer: one parent lock per parent and one RCU
// grace period for all of a batch's interfaces (ip link del group), yielding
// to prepares in flight. An agent that crashes resumes the queue at start. A
// queued share keeps its class numbers and names until it is reaped, and a
// prepare of the same share reaps it first, so nothing prepared collides
// with what is being removed.
//
// NIC work is locked per parent (qdiscs, classes, the IFB) and per node only
// for pool addresses, each lock both in-process and an flock in the state
// directory, so that two agents during a rolling update never pick the same
// class or address; shares of different parents prepare in parallel. Under
// the parent's lock a share's classes are made (a class a direction, its
// block of minors picked); its flow children and leaves, its classifier
// entries, and at unprepare the park of its blocks, are the share's alone
// and run outside it, so a burst of shares on one parent does not queue on
// some forty requests each (issue 44). Likewise the pool lock covers the
// pick of a candidate address and its write to the share's attach spec,
// not the API server's record of a cluster-wide pool's address, which is
// taken outside it (allocateFromPools). A
// steady-state prepare makes no qdisc or class dump: what carve set up on a
// parent is remembered under its lock and looked at again after any failure.
// Attach specs and claim files describe this boot only and are replaced
// atomically without fsync, and so is the checkpoint, whose records a
// reboot drops.
//
// # No event silently unshapes anyone
//
// Two agents on a node (a rolling update with maxSurge: 1) take a node-wide
// flock around NIC work, so class numbers and pool addresses are never
// picked twice; a share's classes are never taken over (a parked block is
// taken only after the kernel, asked under the parent's lock, says it is
// still parked: park.go). A checkpoint written by
// a newer carve (found after a rollback) stops the agent with a clear error
// instead of being set aside. A restart never deletes a classifier entry
// because the checkpoint is empty: each share's attach spec names its claim
// and boot, so the kubelet's unprepare of a claim the checkpoint lost still
// removes its link, classes and entries, and the records, claim files and
// specs of an earlier boot are removed. A dead link-event subscription is
// made again. A pod sandbox that is recreated gets its share's interface made
// again by the hook (same name, MAC and mode), and the hook gives up after
// 58 s rather than hold a pod's start for good (hook.TimeoutSeconds).
//
// # Security model
//
// carve runs privileged on every node and rewires the node's own NICs. What
// each party can do:
//
// A pod gets its devices through CDI and its share's interface through the
// hook. A container with CAP_NET_ADMIN or CAP_SYS_ADMIN (a privileged one
// has both; so has one whose bundle lists no capabilities, which runc then
// keeps) does not get a NIC share unless its DeviceClass sets
// allowNetAdmin: the hook reads its bundle's capability sets and fails,
// naming the option, so the runtime does not start it (measured on the
// real node, TestNodeShareEscapes). A container of the pod that uses no
// NIC claim runs no hook of carve's and is not checked: Pod Security
// "baseline" forbids adding NET_ADMIN. Where the class allows it, a link
// the pod nests on its share's interface (a macvlan there lands on the
// node's NIC, and in source mode receives others' frames) is removed within
// a second, with an Event on the pod and carve_share_nested_links_removed_total
// (nested.go; measured on the real node: gone before the pod's next
// command). Where the class allows it, a pod (any capabilities its pod
// spec grants) cannot:
//
//   - Claim another's identity on the wire (SR-IOV spoofchk, and IP). Pods
//     get CAP_NET_RAW by default and may write any frame; with CAP_NET_ADMIN
//     they may change their interface's MAC. The classifier knows a pod's
//     frames by the sending socket's network namespace, which a pod cannot
//     change, and drops on the parent, counted by reason, every frame whose
//     source MAC is not the share's (unless the DeviceClass sets
//     allowMACChange), that carries an 802.1Q/802.1ad tag but its share's
//     own VLAN's, or whose IPv4/IPv6 source, ARP sender or ND advertisement
//     target is not one of the share's addresses (the unspecified IPv6
//     address and the link-local one its MAC makes excepted). A family the
//     share was given no address in is closed so, unless its DeviceClass
//     lists it in openFamilies (addresses from DHCP or SLAAC), where its
//     sources go unchecked (TestClosedFamilies). Other ethertypes than
//     IPv4, ARP and IPv6, and IPv6 router advertisements and redirects,
//     are dropped unless the DeviceClass lists them in ethertypes or sets
//     allowRouterAdvertisements (TestClassPolicyOnTheWire). The full
//     allow-list, checked also on the pod's own interface for every frame
//     it sends, its kernel's own included, is bpf/policy.h. Measured on the real
//     node (TestNodeShareEscapes): 92k–379k forged frames per 2 s flood
//     dropped, at most 340 bytes (the pods' own ARP/ND) reaching the
//     server's end, none charged to the neighbour, the server's ARP cache
//     clean, and the attacker's own TCP at 0.956 of its share (met). A
//     share without an egress limit is recorded too, so it is checked and
//     its frames are never charged to another share. A frame a pod forwards
//     without a socket of its own is classified by source MAC only.
//   - Get more than its ingress share past the IFB as pure ACKs (a sender
//     on another node can make any number). What skips is an allow-list (an
//     IPv4 or IPv6 header, TCP straight after it, no fragment, no payload by
//     the IP header's length, ACK set and no flag but ECE and CWR), charged
//     at its whole frame's length, padding included, against a clock per
//     share that lets through a sixteenth of the share's ingress rate after
//     a burst of 16 minimum frames; past that the frames queue in the
//     share's class as any other (TestPureACKBudget). The IP layer drops
//     what follows the header's length, so no data reaches the pod this way.
//   - Escape its ingress share by changing its MAC, in a class that allows
//     it. Ingress classification follows the MACs the egress classifier
//     learns for such a share, keyed by (parent, MAC), at most 4 per share,
//     never a MAC that is another share's (either direction) or a parent's;
//     a frame from any other MAC, or past the 4, is dropped (measured on the
//     real node: 19.1 Mbit/s each way of a 20M share after `ip link set net1
//     address ...`). Frames for the node's own MAC (PACKET_HOST) are never
//     redirected whatever was learned. A node whose parent also carries
//     interfaces that are not carve's shares should not share that parent
//     with MAC-changing classes: a pod forging such an interface's MAC would
//     have the traffic towards it counted against its own ingress class.
//   - Bypass the shaper towards another share. In macvlan bridge mode a frame
//     from one child to another of the same parent is handed across and never
//     reaches the parent's egress (a 20M share sent 716 Mbit/s to its
//     neighbour). Shares therefore default to vepa, where every frame leaves
//     through the parent and its shaper, and a bandwidth share in bridge mode
//     is refused. ipvlan children are always made in ipvlan's vepa for the
//     same reason. The cost: two pods sharing a parent reach each other only
//     through a switch that hairpins (reflective relay); private cuts them off
//     entirely. Across nodes on one segment both reach each other: who
//     reaches whom by mode and segment is in ISOLATION.md.
//   - Move traffic between ipvlan shares by addresses. Its egress stays in its
//     own class whatever source address it sends from, another share's
//     included: the pod's namespace names its share first. The addresses that
//     name shares on ingress come only from DeviceClasses and the node
//     config's pools, are written by the agent, and are never learned from
//     frames (a learned address could be the node's own, or one the node
//     routes elsewhere, and would pull that traffic into the pod's class). So
//     frames towards a share's address are charged to that share, the one
//     whose claim holds it, whichever interface took the address; ipvlan
//     itself refuses an address that another child of the parent holds, and
//     two shares of one parent with the same address are refused at prepare.
//     What does not hold: a pod with CAP_NET_ADMIN that adds an address of no
//     claim receives the traffic towards it unshaped. Do not grant NET_ADMIN
//     to pods with ipvlan bandwidth shares (the Pod Security baseline forbids
//     adding it).
//   - Take broadcast or multicast at others' cost. What a share sends,
//     broadcast and multicast included, is charged to its egress class. What
//     it receives is shaped only when unicast to its MAC (ipvlan: to its
//     address): broadcast and multicast arrive once for every child of the
//     parent and are charged to no share.
//   - Reach the node's network. The hook refuses a pod in the node's network
//     namespace (hostNetwork), so a share's addresses and routes never land
//     on the node; it configures only an interface that carries carve's alias
//     (never the CNI's eth0 or another interface that merely has the
//     requested name), and lo and eth0 are reserved names. A pod holding two
//     shares of one parent is refused (their frames could not be told
//     apart).
//
// A claim author (whoever can create a ResourceClaim or template) chooses, in
// a NetworkConfig, only the interface's name in the pod, its MTU, its
// ceilings (within its class's maxCeiling) and which of the address pools
// its DeviceClass names (pools and allowedPools) it draws from: pools belong to classes, and a class that names none leaves its
// claims none. The chart's nic class names every pool of the chart's node
// config (nicClassAllowedPools); tenants kept apart by subnet each get a
// class naming their pools, with a ResourceQuota keeping other namespaces
// off it. What touches the physical network comes only from the
// DeviceClass: the interface mode, a VLAN, static addresses and routes; a
// claim that sets them is refused at prepare with the field named
// ("...parameters.vlan: Forbidden: set by the DeviceClass (the admin)"), and
// the class's values stay while the claim's allowed fields override it.
// passthru (the whole NIC to one pod) is never a share's mode, from anyone. A
// claim cannot set CARVE_* environment variables, a default route without a
// gateway, routes of the wrong address family or duplicate addresses: all
// refused at prepare, before anything is applied.
//
// An admin (DeviceClasses, the node config, the chart) decides modes, VLANs,
// addresses and routes, which NICs are published and their bandwidth, and
// may let pods with NET_ADMIN take shares (allowNetAdmin); carve still never touches a parent's root qdisc,
// never publishes its own links (cv*, cvifb*, cveg*) as NICs, and keeps the
// node's own traffic off the IFB and the egress shaper.
//
// The agent itself holds the least it needs: its ServiceAccount may patch
// only status.devices of its own driver on claims allocated on its own node
// (the resourceclaims/driver synthetic subresource with associated-node:
// verbs, Kubernetes >= 1.36; no update, no resourceclaims/binding, so no
// change of an allocation), write only its own node's ResourceSlices (the
// admission policy: its node, its node's pool and its driver), read claims
// and its Node, and create (and patch, when they repeat) core Events: the
// GPU policing loop's kill warnings on pods. Metrics, which name every
// tenant's claims and have no authentication, listen on loopback by default
// (the chart's metricsHost; the pod IP is an opt-in, with a NetworkPolicy
// admitting only the named scrapers), health on the pod IP, never every
// address of the node. The state directory is 0711: a claim's MPS server,
// running as its pod's user, passes through it to its pipe directory, and
// a host user who knows a claim's hashed directory name can reach that
// daemon's socket too (host users are trusted with the node's GPUs here);
// the checkpoint is 0600, the directories of claim files and netdev records
// 0700, and the claim files containers read stay 0644 and hold no secrets.
//
// # Tests
//
// A NIC share is enforceable when the kernel has BPF, TCX or clsact with
// cls_bpf, HTB (on a veth pair) for egress, IFB with HTB, u32 and mirred for
// ingress, and macvlan or ipvlan (probed by package kernelprobe). The bpf
// and netdev tests skip only on the kernel's own answer that it lacks a
// kind: ENOENT for a qdisc or tc filter kind, EOPNOTSUPP for a link kind,
// ebpf.ErrNotSupported for a BPF feature, and never for a kind the running
// kernel's /proc/config.gz builds in (nettest.KernelLacks, in bpf/nettest);
// any other error fails. As root, make unit sets CARVE_NET_REQUIRED=1, and
// the bpf and netdev tests then fail, rather than skip, without root or
// bpffs.
package netdev
