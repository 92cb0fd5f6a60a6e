// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// Included by shaper.c, after classify(): the egress side of the parent,
// where limited shares' frames leave for the parent's egress shaper and come
// back. Part of the one program object bpf2go builds from shaper.c (`make
// generate` after changing it).

// The egress shaper of each parent: a veth pair beside it. A limited
// share's frame leaves the parent's egress for the pair's first end, whose
// HTB holds it to the share's rate; its peer receives it, and return_shaped
// sends it back out of the parent. The parent's own root qdisc (noqueue on
// a veth, mq on a multi-queue NIC) is never carve's, so traffic of no
// limited share pays only for classify_egress, not for a qdisc lock.
struct egress_shaper {
	__u32 shaper_ifindex; // the end whose egress holds the share classes
	__u32 return_ifindex; // its peer, from which shaped frames come back
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32); // the parent's ifindex
	__type(value, struct egress_shaper);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_shapers SEC(".maps");

struct shaper_return {
	__u32 parent_ifindex;
	__u8 shaper_mac[ETH_ALEN]; // the shaper end's own MAC
	__u8 pad[2];               // always zero
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32); // the return end's ifindex
	__type(value, struct shaper_return);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shaper_returns SEC(".maps");

// On the parent's egress. A frame back from the parent's shaper passes
// untouched: it was classified and counted on its first way out. A frame of
// a limited share goes to the shaper. Any other frame passes with its own
// priority: skb->priority is cleared only to learn whether classify set a
// class, as a socket may set any priority (SO_PRIORITY), one that reads as
// a share's class included.
SEC("tc")
int classify_egress(struct __sk_buff *skb)
{
	__u32 parent = skb->ifindex;
	struct egress_shaper *sh = bpf_map_lookup_elem(&egress_shapers, &parent);

	if (!sh)
		return classify(skb, DIR_EGRESS); // an older carve's HTB root on the parent
	if (skb->ingress_ifindex == sh->return_ifindex)
		return CARVE_TCX_NEXT;
	// No frame comes to the parent with a stamp of the AQM's (aqm.h) but
	// one a pod forged with SO_TXTIME, to stir another share's CoDel from
	// the shaper's far end: the classifier stamps a frame it queues anew.
	if (skb->tstamp & AQM_STAMP_BIT)
		skb->tstamp = 0;
	__u32 own = skb->priority;
	skb->priority = 0;
	if (classify(skb, DIR_EGRESS) == TC_ACT_SHOT)
		return TC_ACT_SHOT; // a pod's forged frame
	if (!skb->priority) {
		// No limited share's: the parent's unshared class, where its
		// node config gives it one, else the parent's own qdisc.
		__u32 unshared = unshared_classid(parent, DIR_EGRESS);
		if (!unshared) {
			skb->priority = own;
			return CARVE_TCX_NEXT;
		}
		skb->priority = unshared;
	}
	return bpf_redirect(sh->shaper_ifindex, 0); // to its egress, the HTB
}

// On the ingress of the shaper's return end: every frame there left a share
// class of the shaper and goes back out of the parent, except what the node
// itself sent from the shaper end (IPv6 neighbour discovery, LLDP...),
// which must never reach the parent's wire. It is the first hook after the
// egress classes' queues, where the AQM learns each frame's sojourn
// (aqm.h).
SEC("tc")
int return_shaped(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	struct shaper_return *r = bpf_map_lookup_elem(&shaper_returns, &ifindex);
	__u8 src[ETH_ALEN];

	if (!r || bpf_skb_load_bytes(skb, ETH_ALEN, src, ETH_ALEN) < 0)
		return TC_ACT_SHOT;
	if (mac_eq(src, r->shaper_mac))
		return TC_ACT_SHOT;
	aqm_dequeue(skb);
	return bpf_redirect(r->parent_ifindex, 0); // to the parent's egress
}
