// Package bpf holds carve's per-share classifier: the sched_cls programs in
// shaper.c (built with bpf2go into shaper_bpfel.go and shaper_bpfel.o),
// their pinned maps and links, and their attachment through TCX, or clsact
// and cls_bpf where the kernel has no TCX. The programs find each frame's
// bandwidth share and set skb->priority to that share's HTB class
// (skb->tc_classid is only 16 bits), so HTB on the parent NIC's egress
// shaper (egress; the program redirects the share's frames there) or on its
// IFB (ingress) holds each share to its rate. Package netdev makes the
// shaper, the IFB and the classes; this package only classifies, counts and
// redirects.
//
// # Egress
//
// A program at the head of the parent's TCX egress hook finds each frame's
// share and redirects the frames of limited shares to the parent's egress
// shaper, a veth pair cveg<ifindex>/cveg<ifindex>r. A pod's frames are found
// by the network namespace of the socket that sent them
// (bpf_get_netns_cookie), which the netns-attach hook records for the share
// once the pod exists; a pod cannot change it, so raw frames with a forged
// source MAC, or a changed interface MAC, stay in the pod's class. Frames of
// no pod namespace (the node's, forwarded ones) fall back to their source
// MAC. A program on the ingress of the shaper's peer (a cls_bpf filter: a
// TCX attach waits for an RCU grace period, 7–15 ms on the project's
// machine, on every parent's first limited share) sends the frames back out
// of the parent, where the classifier lets them pass (they come from the
// peer) without counting them again. Traffic of no limited share never
// enters a qdisc of carve's and keeps its own skb->priority. A share without
// an egress limit is recorded too, so its frames are never charged to
// another share.
//
// # Ingress
//
// A second program at the head of the parent's TCX ingress redirects frames
// whose destination MAC is a share's to the IFB cvifb<ifindex>, whose
// classifier, keyed by destination MAC, chooses the class. The node's own
// traffic, and broadcast and multicast, stay on the parent, off the IFB's
// single queue; frames for the node's own MAC (PACKET_HOST) are never
// redirected, whatever was learned.
//
// The egress classifier learns any other source MAC a pod's frames carry (a
// pod that changes its MAC must send from it, if only to answer ARP), and
// ingress classification follows it. A MAC that is another share's is never
// learned, and an LRU of 4096 (learned_macs) bounds what a pod forging many
// MACs can fill.
//
// # Address-keyed shares (ipvlan)
//
// An ipvlan child sends and receives with its parent's MAC, so its share is
// told apart by address: share_addrs (4096 entries, keyed by parent and
// address, written only by the agent, never learned from frames) points each
// of the share's addresses to the MAC carve derives for the share. That MAC
// is on no interface; it names the share's class entries and counters, and
// those entries are marked so that no frame's MAC reaches them. Egress: the
// pod's namespace names its share first; frames of no pod namespace are
// found by source address. Ingress: the redirect on the parent also takes
// frames for the parent's own MAC whose destination address is a share's,
// and the IFB's classifier finds the share by destination address. IPv4 and
// IPv6, also behind a VLAN tag in the frame. The node's own traffic (to its
// own addresses), broadcast and multicast stay off the IFB.
//
// # Pinning and attachment
//
// The maps and TCX links are pinned under /sys/fs/bpf/carve (--bpf-pin-dir;
// bpffs is mounted where missing) so that the agent can restart without
// dropping limits: a new process reopens the same maps with their entries and
// swaps its programs into the existing links. At start the agent unpins links
// whose network namespace is gone (ifindex 0). The programs are attached at
// the head of TCX and return TCX_NEXT, so a CNI program that returns pass
// (Cilium's) runs after them and cannot hide frames from them; a re-attach
// retakes the head. The per-share counters in the pinned maps are what
// carve_share_bytes_total, carve_share_packets_total and `carve shares`
// read.
//
// The edt_egress program (EDT pacing under an fq root) stays in the
// classifier with its tests, unused for new shares (package netdev says why);
// shares an older carve paced that way keep their rate until unprepared.
//
// # Cost
//
// Per packet, BPF_PROG_TEST_RUN with a 64-byte frame (make bench): 107–110 ns
// for a share's frame, 74 ns for a frame of no share (most of it the test-run
// loop). The address lookup costs a frame of no share about 20 ns more
// (BenchmarkClassifyByAddress/miss against BenchmarkClassify/miss: 131
// against 111 ns), and nothing on a node that never had an address-keyed
// share.
//
// Package nettest (bpf/nettest) builds the namespaces, veths and traffic the
// bpf and netdev tests run on, and decides when they may skip (KernelLacks).
package bpf
