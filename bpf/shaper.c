//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// Per-share classifier for HTB. Each bandwidth share of a parent NIC is
// identified by a MAC address; the program looks the MAC up in `shares` and
// writes the share's HTB class handle into skb->priority. HTB classifies by
// skb->priority before running any filter, so no tc filter is needed on the
// HTB qdisc (skb->tc_classid, the cls_bpf route, is only 16 bits wide and
// cannot carry a full major:minor handle). A share whose interface has no
// MAC of its own (an ipvlan child carries its parent's) is found by its IP
// addresses instead (share_addrs), and still named by a MAC of carve's.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

// linux-libc-dev on Debian 12 predates TCX (6.6), so spell the verdict out.
// TCX_NEXT (== TC_ACT_UNSPEC, -1) lets the next TCX program, then the legacy
// clsact filters, see the packet; once none is left the packet passes to the
// qdisc. TCX_PASS (0, TC_ACT_OK) would also pass it but skip every program
// and filter attached after us. In cls_bpf direct-action mode -1 likewise
// means "continue with the next filter", so one constant serves both hooks.
#define CARVE_TCX_NEXT (-1)

enum {
	DIR_EGRESS = 0,  // keyed by the source MAC: traffic leaving a share
	DIR_INGRESS = 1, // keyed by the destination MAC: traffic towards a share
};

struct share_key {
	__u8 mac[ETH_ALEN];
	__u8 dir;
	__u8 pad; // always zero, or lookups miss
};

struct share_val {
	__u32 classid; // HTB class handle, major<<16 | minor; 0: unshaped
	__u32 flags;   // SHARE_* bits, and the guard above SHARE_GUARD_SHIFT
};

// The share is found by its addresses (share_addrs) and its pod's netns,
// never by a frame's MAC: an ipvlan child sends and receives with its
// parent's MAC, and the MAC that names such a share is on no interface.
#define SHARE_BY_ADDR 1
// An egress entry that carries the share's source guard (its netns_val's
// vlan_flags, in bits 16-31) for the frames its pod sends with no socket of
// its pod's netns: the kernel's own ARP replies for an address the pod
// added, frames the pod forwards. Such frames are found by source MAC, so
// they get the same checks as the pod's socket frames. An entry with
// classid 0 is a guard only (the share has no egress limit). Pins made by
// an older carve have no guard bits: their frames pass as before.
#define SHARE_GUARDED 2
#define SHARE_GUARD_SHIFT 16

struct share_counters {
	__u64 bytes; // skb->len: whole frames, GSO super-packets included
	__u64 packets;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct share_key);
	__type(value, struct share_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} shares SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct share_key);
	__type(value, struct share_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_stats SEC(".maps");

// Egress shares by the sending socket's network namespace: a pod cannot
// change the netns of its own sockets, whereas it can forge a frame's source
// MAC (CAP_NET_RAW) or change its interface's (CAP_NET_ADMIN). Every frame
// a pod sends through its macvlan, raw AF_PACKET frames included, reaches
// the parent with the pod's socket. Keyed by the parent's ifindex too, as a
// pod may hold shares of several parents.
struct netns_key {
	__u64 cookie; // bpf_get_netns_cookie of the sending socket
	__u32 ifindex; // the parent's
	__u32 pad;     // always zero
};

struct netns_val {
	__u32 classid;      // 0: the pod's share has no egress limit
	__u8 mac[ETH_ALEN]; // the share's, naming its counters
	// Bits 0-11: the share's VLAN on its parent (0: none), which the
	// share's VLAN device tags its frames with; bits 12-15: NETNS_*
	// flags. Packed into what was padding, so that pins made by an older
	// carve (zero here: no VLAN, strict MAC) stay compatible.
	__u16 vlan_flags;
};

// The pod may send from MACs other than its share's (the class's
// allowMACChange); they are learned for ingress (see learned_on_parent).
#define NETNS_ALLOW_MAC_CHANGE 1
// The share has known IPv4 addresses (allowed_addrs): IPv4 sources and ARP
// senders outside them are dropped.
#define NETNS_CHECK_IPV4 2
// The share has known IPv6 addresses: IPv6 sources and ND advertisement
// targets outside them (and link-local) are dropped. A share given only
// IPv4 addresses keeps the IPv6 addresses its pod makes (SLAAC).
#define NETNS_CHECK_IPV6 4
// The pod may send IPv6 router advertisements and redirects (the class's
// allowRouterAdvertisements): it routes for its segment.
#define NETNS_ALLOW_ROUTER 8
#define NETNS_VLAN_MASK 0x0fff
#define NETNS_FLAGS_SHIFT 12

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct netns_key);
	__type(value, struct netns_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_netns SEC(".maps");

// A pod whose class allows MAC changes (NETNS_ALLOW_MAC_CHANGE) may send
// from another MAC than its share's; traffic towards that MAC would miss
// `shares` and arrive unshaped. Such a pod still sends from its own
// namespace (it must, if only to answer ARP for the new MAC), so the egress
// classifier learns: a source MAC seen on a frame of the pod's share, and
// not its own, is mapped to the share's MAC here, on that parent, and
// ingress classification follows it. Nothing is learned for any other
// share (its frames from a foreign MAC are dropped), nor a MAC that is
// already a share's or a local interface's (local_macs), and at most
// LEARN_CAP MACs per share (learned_count), so a pod forging MACs cannot
// move a neighbour's ingress nor fill the map.
struct learned_on_parent_key {
	__u32 ifindex; // the parent's
	__u8 mac[ETH_ALEN];
	__u8 pad[2]; // always zero
};

struct learned_key {
	__u8 mac[ETH_ALEN];
	__u8 pad[2]; // always zero
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct learned_on_parent_key);
	__type(value, struct learned_key); // the share's own MAC
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} learned_on_parent SEC(".maps");

#define LEARN_CAP 4

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct learned_key); // the share's MAC
	__type(value, __u32);            // MACs learned for it
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} learned_count SEC(".maps");

// Set once a MAC is first learned on the node, so that frames matching no
// share by MAC look for a learned one only where there may be some.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} learned_used SEC(".maps");

// The MACs of the node's interfaces that carry shares (the parents), each
// with its ifindex, written by the agent: never learned for a pod, and the
// one MAC an address-keyed (ipvlan) share's frames carry besides its own.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct learned_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} local_macs SEC(".maps");

// The IFB that shapes each parent's ingress: parent ifindex -> IFB ifindex.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ifb_of SEC(".maps");

// The class of the traffic of no limited share on each parent whose node
// config reserves it a floor (netdev's unshared class, beside the borrowing
// shares under the parent's link class): parent ifindex * 2 + direction ->
// its class id on the parent's egress shaper (DIR_EGRESS) or IFB. On such
// a parent the node's own frames and unlimited shares' go through the
// shaper and the IFB too, so that the shares' floors hold against them.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} unshared_class SEC(".maps");

// Nonzero once a parent has had an unshared class in this pin directory,
// never cleared (as addrs_used): other nodes skip the lookup.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} unshared_used SEC(".maps");

// unshared_classid is parent's unshared class in direction dir, 0 where
// it has none.
static __always_inline __u32 unshared_classid(__u32 parent, __u8 dir)
{
	__u32 zero = 0;
	__u32 *used = bpf_map_lookup_elem(&unshared_used, &zero);
	if (!used || !*used)
		return 0;
	__u32 k = parent * 2 + dir;
	__u32 *c = bpf_map_lookup_elem(&unshared_class, &k);
	return c ? *c : 0;
}

// Shares told apart by address (ipvlan children, which all carry their
// parent's MAC): each address a share was given (its claim's static
// addresses and pool addresses, written by the agent only) on its parent,
// mapped to the MAC that names the share's entries in `shares` and its
// counters. Egress frames are found by source address, ingress frames by
// destination address. Never learned from frames: see addr_share.
struct addr_key {
	__u32 ifindex; // the parent's
	__u8 family;   // 4 or 6
	__u8 pad;      // always zero
	__u16 vlan;    // the share's VLAN on the parent, 0 for none (host order)
	__u8 addr[16]; // IPv4 in the first four bytes, the rest zero
};

struct addr_owner {
	__u8 mac[ETH_ALEN]; // the share's
	__u8 pad[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct addr_key);
	__type(value, struct addr_owner);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_addrs SEC(".maps");

// Nonzero once an address has been recorded in share_addrs of this pin
// directory, and never cleared (a stale 1 only costs the lookups, while
// clearing it could race an agent adding an address): nodes without
// address-keyed shares skip the address lookup, whose parsing and hashing
// every frame of no share would otherwise pay (about 20 ns a frame:
// BenchmarkClassifyByAddress/miss against BenchmarkClassify/miss).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} addrs_used SEC(".maps");

// The addresses each share may send from (its claim's static and pool
// addresses, written by the agent), for the shares flagged
// NETNS_CHECK_IPV4/IPV6: SR-IOV spoofchk, extended to IP. Separate from
// share_addrs, which classifies by address and holds address-keyed shares
// only.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct addr_key);
	__type(value, struct addr_owner);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} allowed_addrs SEC(".maps");

// The ethertypes besides IPv4, ARP and IPv6 a share's pod may send (its
// class's ethertypes, written by the agent with the share's guard): a key
// present is allowed. Looked up only for a frame of another ethertype, so
// that the IP path pays nothing for it.
struct ethertype_key {
	__u32 parent;       // the parent's ifindex
	__u8 mac[ETH_ALEN]; // the share's
	__u16 proto;        // network byte order, as in the frame
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct ethertype_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_ethertypes SEC(".maps");

// Why a pod's frame was dropped (spoof_drops' reason).
enum {
	SPOOF_OK = 0,
	SPOOF_SRC_MAC = 1, // a source MAC not the share's
	SPOOF_VLAN = 2,    // an 802.1Q/802.1ad tag the pod put in the frame
	SPOOF_SRC_IP = 3,  // an IPv4 or IPv6 source outside the share's addresses
	SPOOF_ARP = 4,     // an ARP sender (MAC or IPv4) not the share's
	SPOOF_ND = 5,      // an IPv6 neighbour advertisement for an address not the share's
	SPOOF_ETHERTYPE = 6, // an ethertype but IPv4, ARP and IPv6
	SPOOF_LINK_LOCAL = 7, // towards an IEEE 802.1 link-local group (STP, PAUSE, LACP, LLDP)
	SPOOF_ROUTER = 8,  // an IPv6 router advertisement or redirect
	SPOOF_IPV6_HEADERS = 9, // IPv6 extension headers past what the check walks
};

struct drop_key {
	__u8 mac[ETH_ALEN]; // the share's
	__u8 reason;        // SPOOF_*
	__u8 pad;           // always zero
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct drop_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} spoof_drops SEC(".maps");

// EDT pacing, an alternative to HTB for kernels with sch_fq: the program
// stamps each frame with the earliest time it may leave and fq on the
// device holds it until then. Without fq nothing honours the stamp. netdev
// does not use it: fq would have to be the parent's root qdisc, which every
// other sender on the parent would then pay for.
struct share_rate {
	__u64 bytes_per_sec; // 0: unpaced
	__u64 t_last;        // departure time of the previous frame, ns (mono)
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct share_key);
	__type(value, struct share_rate);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_rates SEC(".maps");

// Frames that would wait longer than this are dropped rather than queued:
// fq's own horizon (10 s) is far too deep for TCP to react to.
#define EDT_HORIZON_NS (2ULL * 1000 * 1000 * 1000)
#define NSEC_PER_SEC (1000ULL * 1000 * 1000)

static __always_inline void count(struct share_key *key, __u32 len)
{
	struct share_counters *c = bpf_map_lookup_elem(&share_stats, key);
	if (!c) {
		// A new per-CPU element is zero on every other CPU, so
		// inserting this packet's counts is exact. Losing the race to
		// another CPU's insert only means looking up again.
		struct share_counters init = { .bytes = len, .packets = 1 };
		if (bpf_map_update_elem(&share_stats, key, &init, BPF_NOEXIST) == 0)
			return;
		c = bpf_map_lookup_elem(&share_stats, key);
		if (!c)
			return; // map full
	}
	// Per-CPU value, and tc runs with preemption off: plain adds suffice.
	c->bytes += len;
	c->packets += 1;
}

// bpf_get_netns_cookie is a tc helper only since Linux 6.15: before, the
// verifier refuses the whole program (Debian's 6.1 and 6.12, make vmtest).
// OpenShaper clears tc_netns_cookie where the kernel lacks the helper, and
// netns_cookie then reads the same cookie (the net_cookie of the socket's
// namespace, which SO_NETNS_COOKIE gives the agent) with
// bpf_probe_read_kernel, its offsets relocated from the kernel's BTF. The
// verifier never walks a branch the constant rules out, so one object loads
// on both.
volatile const __u8 tc_netns_cookie = 1;

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)
struct net___carve {
	__u64 net_cookie;
};
typedef struct {
	struct net___carve *net;
} possible_net_t___carve;
struct sock_common___carve {
	possible_net_t___carve skc_net;
};
#pragma clang attribute pop

// The bytes of struct sock copied to reach skc_net (48 on 6.1 and 6.12).
#define SOCK_HEAD 96

// netns_cookie is bpf_get_netns_cookie(skb) where the kernel has it for tc
// programs, else the same read through the socket; 0 for a frame with no
// socket, which is in no pod's entry either way.
static __always_inline __u64 netns_cookie(struct __sk_buff *skb)
{
	if (tc_netns_cookie)
		return bpf_get_netns_cookie(skb);
	struct bpf_sock *sk = skb->sk;
	if (!sk)
		return 0;
	// The verifier allows no arithmetic on a socket pointer, so the
	// socket's head is copied whole and skc_net taken from the copy.
	__u8 head[SOCK_HEAD];
	__u32 off = bpf_core_field_offset(struct sock_common___carve, skc_net);
	if (off > SOCK_HEAD - 8)
		return 0;
	if (bpf_probe_read_kernel(head, off + 8, sk))
		return 0;
	__u64 net = 0, cookie = 0;
	__builtin_memcpy(&net, head + off, 8);
	if (!net || bpf_probe_read_kernel(&cookie, 8, (void *)(net + bpf_core_field_offset(struct net___carve, net_cookie))))
		return 0;
	return cookie;
}

// netns_share finds the share of the pod whose socket sent skb out of the
// parent, or NULL: the host's own frames and frames with no socket (the
// host's cookie) are in no pod's entry.
static __always_inline struct netns_val *netns_share(struct __sk_buff *skb)
{
	struct netns_key nk = {
		.cookie = netns_cookie(skb),
		.ifindex = skb->ifindex,
	};
	return bpf_map_lookup_elem(&share_netns, &nk);
}

// mac_eq compares two MACs (clang has no memcmp for BPF).
static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] && a[5] == b[5];
}

// mac_share finds the share named by key->mac, unless that share is found
// by address only (SHARE_BY_ADDR).
static __always_inline struct share_val *mac_share(struct share_key *key)
{
	struct share_val *v = bpf_map_lookup_elem(&shares, key);
	if (v && (v->flags & SHARE_BY_ADDR))
		return NULL;
	return v;
}

// l3_addr copies the source (egress) or destination (ingress) address of
// the IPv4 or IPv6 header at l3 into k; -1 where the header is not there.
static __always_inline int l3_addr(void *l3, void *end, __u16 proto, __u8 dir, struct addr_key *k)
{
	if (proto == bpf_htons(ETH_P_IP)) {
		if (l3 + 20 > end)
			return -1;
		k->family = 4;
		if (dir == DIR_EGRESS)
			__builtin_memcpy(k->addr, l3 + 12, 4);
		else
			__builtin_memcpy(k->addr, l3 + 16, 4);
		return 0;
	}
	if (proto == bpf_htons(ETH_P_IPV6)) {
		if (l3 + 40 > end)
			return -1;
		k->family = 6;
		if (dir == DIR_EGRESS)
			__builtin_memcpy(k->addr, l3 + 8, 16);
		else
			__builtin_memcpy(k->addr, l3 + 24, 16);
		return 0;
	}
	return -1;
}

// frame_addr reads a frame's source (egress) or destination (ingress) IPv4
// or IPv6 address into k, with its VLAN: the skb's accelerated tag, else
// one tag in the frame, which is skipped; anything else is no share's. The
// headers are read in place where they are in the skb's linear data
// (nearly always; cheaper than copying them out), else copied.
static __always_inline int frame_addr(struct __sk_buff *skb, __u8 dir, struct addr_key *k)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__u16 proto;

	if (skb->vlan_present)
		k->vlan = skb->vlan_tci & 0x0fff;
	if (data + ETH_HLEN + 4 <= end) {
		void *l3 = data + ETH_HLEN;
		proto = *(__u16 *)(data + 2 * ETH_ALEN);
		if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
			if (!skb->vlan_present)
				k->vlan = bpf_ntohs(*(__u16 *)(data + ETH_HLEN)) & 0x0fff;
			proto = *(__u16 *)(data + 2 * ETH_ALEN + 4);
			l3 += 4;
		}
		if (proto != bpf_htons(ETH_P_IP) && proto != bpf_htons(ETH_P_IPV6))
			return -1;
		if (l3_addr(l3, end, proto, dir, k) == 0)
			return 0;
	}
	// The IP header is not all in the linear data: copy it out.
	__u32 off = ETH_HLEN;
	if (bpf_skb_load_bytes(skb, 2 * ETH_ALEN, &proto, sizeof(proto)) < 0)
		return -1;
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		__u16 tci;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &tci, sizeof(tci)) < 0 ||
		    bpf_skb_load_bytes(skb, 2 * ETH_ALEN + 4, &proto, sizeof(proto)) < 0)
			return -1;
		if (!skb->vlan_present)
			k->vlan = bpf_ntohs(tci) & 0x0fff;
		off += 4;
	}
	if (proto == bpf_htons(ETH_P_IP)) {
		k->family = 4;
		return bpf_skb_load_bytes(skb, off + (dir == DIR_EGRESS ? 12 : 16), k->addr, 4);
	}
	if (proto == bpf_htons(ETH_P_IPV6)) {
		k->family = 6;
		return bpf_skb_load_bytes(skb, off + (dir == DIR_EGRESS ? 8 : 24), k->addr, 16);
	}
	return -1;
}

// addr_owner sets key->mac to the share whose address the frame carries on
// parent (its source address for egress, destination for ingress), and
// reports whether there is one. Addresses are never learned from frames: a
// pod could teach the node's own address, or one the node routes elsewhere,
// and so pull other traffic into its class. An address a pod adds on its
// own is therefore no share's, and an address of another share is charged
// to that share, the one whose claim holds it.
static __always_inline int addr_owner(struct __sk_buff *skb, __u32 parent, struct share_key *key)
{
	__u32 zero = 0;
	__u32 *used = bpf_map_lookup_elem(&addrs_used, &zero);
	if (!used || !*used)
		return 0;
	struct addr_key ak = { .ifindex = parent };
	if (frame_addr(skb, key->dir, &ak) < 0)
		return 0;
	struct addr_owner *o = bpf_map_lookup_elem(&share_addrs, &ak);
	if (!o)
		return 0;
	__builtin_memcpy(key->mac, o->mac, ETH_ALEN);
	return 1;
}

// addr_share finds the share entry of a frame by address (see addr_owner).
static __always_inline struct share_val *addr_share(struct __sk_buff *skb, __u32 parent, struct share_key *key)
{
	if (!addr_owner(skb, parent, key))
		return NULL;
	return bpf_map_lookup_elem(&shares, key);
}

// by_addr reports whether the share named by mac is found by address: its
// frames carry its parent's MAC, which must never be learned for it.
static __always_inline int by_addr(const __u8 *mac)
{
	struct share_key k = { .dir = DIR_INGRESS };
	__builtin_memcpy(k.mac, mac, ETH_ALEN);
	struct share_val *v = bpf_map_lookup_elem(&shares, &k);
	if (!v) {
		k.dir = DIR_EGRESS;
		v = bpf_map_lookup_elem(&shares, &k);
	}
	return v && (v->flags & SHARE_BY_ADDR);
}

// learn maps a source MAC of a pod whose class allows MAC changes to the
// pod's share (named by share) on parent (see learned_on_parent), and
// reports whether src is the share's now: learned for it before or just
// now. Never a MAC that names a share (either direction) or is a node's
// own, never one learned for another share, and at most LEARN_CAP per
// share: a frame from any other is the pod's to lose.
static __always_inline int learn(const __u8 *src, __u32 parent, const __u8 *share)
{
	if (mac_eq(src, share))
		return 1;
	if (by_addr(share))
		return 0;
	struct share_key k = { .dir = DIR_INGRESS };
	__builtin_memcpy(k.mac, src, ETH_ALEN);
	if (bpf_map_lookup_elem(&shares, &k))
		return 0;
	k.dir = DIR_EGRESS;
	if (bpf_map_lookup_elem(&shares, &k))
		return 0;
	struct learned_key lk = {};
	__builtin_memcpy(lk.mac, src, ETH_ALEN);
	if (bpf_map_lookup_elem(&local_macs, &lk))
		return 0;
	struct learned_on_parent_key pk = { .ifindex = parent };
	__builtin_memcpy(pk.mac, src, ETH_ALEN);
	struct learned_key *known = bpf_map_lookup_elem(&learned_on_parent, &pk);
	if (known)
		return mac_eq(known->mac, share); // its own, or another share's
	struct learned_key owner = {};
	__builtin_memcpy(owner.mac, share, ETH_ALEN);
	__u32 *cnt = bpf_map_lookup_elem(&learned_count, &owner);
	if (cnt && *cnt >= LEARN_CAP)
		return 0;
	if (bpf_map_update_elem(&learned_on_parent, &pk, &owner, BPF_NOEXIST) != 0) {
		// Another CPU learned it first: for this share or another.
		known = bpf_map_lookup_elem(&learned_on_parent, &pk);
		return known && mac_eq(known->mac, share);
	}
	__u32 zero = 0, one = 1;
	bpf_map_update_elem(&learned_used, &zero, &one, BPF_ANY);
	if (cnt) {
		__sync_fetch_and_add(cnt, 1);
	} else {
		__u32 one = 1;
		if (bpf_map_update_elem(&learned_count, &owner, &one, BPF_NOEXIST) != 0) {
			cnt = bpf_map_lookup_elem(&learned_count, &owner);
			if (cnt)
				__sync_fetch_and_add(cnt, 1);
		}
	}
	return 1;
}

// What a pod's frame may be: policy.h.
#include "policy.h"

// count_drop counts a dropped frame of the share named by mac.
static __always_inline void count_drop(const __u8 *mac, __u8 reason)
{
	struct drop_key k = { .reason = reason };
	__builtin_memcpy(k.mac, mac, ETH_ALEN);
	__u64 *c = bpf_map_lookup_elem(&spoof_drops, &k);
	if (c) {
		*c += 1; // per CPU, preemption off
		return;
	}
	__u64 one = 1;
	if (bpf_map_update_elem(&spoof_drops, &k, &one, BPF_NOEXIST) != 0) {
		c = bpf_map_lookup_elem(&spoof_drops, &k);
		if (c)
			*c += 1;
	}
}

// ingress_share finds the ingress entry of the share a frame that arrived
// on parent is for: by its destination MAC (where by_mac), else by its
// destination address, else (where by_mac) by the share its destination
// MAC was learned for. Addresses come before learned MACs: an address is
// the agent's word, a learned MAC a guess from a pod's frames. key is set
// to the share's own MAC, which names its counters.
static __always_inline struct share_val *ingress_share(struct __sk_buff *skb, struct share_key *key, __u32 parent, int by_mac)
{
	struct learned_key dst = {};
	struct share_val *v;

	if (bpf_skb_load_bytes(skb, 0, dst.mac, ETH_ALEN) < 0)
		return NULL;
	if (by_mac) {
		__builtin_memcpy(key->mac, dst.mac, ETH_ALEN);
		v = mac_share(key);
		if (v)
			return v;
	}
	v = addr_share(skb, parent, key);
	if (v || !by_mac)
		return v;
	struct learned_on_parent_key pk = { .ifindex = parent };
	__builtin_memcpy(pk.mac, dst.mac, ETH_ALEN);
	struct learned_key *owner = bpf_map_lookup_elem(&learned_on_parent, &pk);
	if (!owner)
		return NULL;
	__builtin_memcpy(key->mac, owner->mac, ETH_ALEN);
	return mac_share(key);
}

// learned_share finds the egress entry of the share whose pod took the
// MAC in key (a class that allows MAC changes; see learned_on_parent) on
// parent, and sets key to the share's own MAC. Only once some MAC was ever
// learned on the node (learned_used): the host's own frames pay nothing
// for it otherwise.
static __always_inline struct share_val *learned_share(__u32 parent, struct share_key *key)
{
	__u32 zero = 0;
	__u32 *used = bpf_map_lookup_elem(&learned_used, &zero);
	if (!used || !*used)
		return NULL;
	struct learned_on_parent_key pk = { .ifindex = parent };
	__builtin_memcpy(pk.mac, key->mac, ETH_ALEN);
	struct learned_key *owner = bpf_map_lookup_elem(&learned_on_parent, &pk);
	if (!owner)
		return NULL;
	struct share_key k = { .dir = DIR_EGRESS };
	__builtin_memcpy(k.mac, owner->mac, ETH_ALEN);
	struct share_val *v = mac_share(&k);
	if (v)
		__builtin_memcpy(key->mac, owner->mac, ETH_ALEN);
	return v;
}

// Flow isolation inside a share: share_flows_classify.
#include "flows.h"

static __always_inline int classify(struct __sk_buff *skb, __u8 dir)
{
	struct share_key key = { .dir = dir };
	struct share_val *v;

	if (dir == DIR_EGRESS) {
		struct netns_val *n = netns_share(skb);
		if (n) {
			// A pod's frame: its own share's, and dropped where it
			// claims to be someone else's.
			int reason = spoof_reason(skb, skb->ifindex, n->mac, n->vlan_flags, 0);
			if (reason != SPOOF_OK) {
				count_drop(n->mac, reason);
				return TC_ACT_SHOT;
			}
			__builtin_memcpy(key.mac, n->mac, ETH_ALEN);
			skb->priority = n->classid;
			if (n->classid) {
				if (share_flows_classify(skb, &key, n->classid))
					return TC_ACT_SHOT; // the AQM's
				count(&key, skb->len);
			}
			return CARVE_TCX_NEXT;
		}
		// Otherwise by source MAC (bytes 6..11 of the frame), else by
		// a MAC learned for a share, else by source address. A frame
		// with no socket of its pod's (see SHARE_GUARDED) is checked
		// here as the pod's own frames are above.
		if (bpf_skb_load_bytes(skb, ETH_ALEN, key.mac, ETH_ALEN) < 0)
			return CARVE_TCX_NEXT;
		v = mac_share(&key);
		if (!v)
			v = learned_share(skb->ifindex, &key);
		if (v && (v->flags & SHARE_GUARDED)) {
			int reason = spoof_reason(skb, skb->ifindex, key.mac, v->flags >> SHARE_GUARD_SHIFT, 0);
			if (reason != SPOOF_OK) {
				count_drop(key.mac, reason);
				return TC_ACT_SHOT;
			}
		}
		if (v && !v->classid)
			return CARVE_TCX_NEXT; // a guard only: the share is unshaped
		if (!v)
			v = addr_share(skb, skb->ifindex, &key);
	} else {
		// On the IFB, the frame's ingress_ifindex is the parent it
		// arrived on; redirect_ingress chose it there.
		v = ingress_share(skb, &key, skb->ingress_ifindex, 1);
	}
	if (!v)
		return CARVE_TCX_NEXT;
	if (share_flows_classify(skb, &key, v->classid))
		return TC_ACT_SHOT; // the AQM's
	count(&key, skb->len);
	return CARVE_TCX_NEXT;
}

// Pure ACKs towards a share, past its IFB: ack_skips.
#include "acks.h"

// classify_egress, on each parent's egress, and the egress shaper's way
// back (return_shaped) are in egress_shaper.h.
#include "egress_shaper.h"

// Attached to the egress of the IFB device that the parent's ingress is
// redirected to, so the IFB's HTB shapes traffic towards each share.
SEC("tc")
int classify_ingress(struct __sk_buff *skb)
{
	return classify(skb, DIR_INGRESS);
}

// On the parent's ingress: frames towards a share go to the parent's IFB to
// be shaped; everything else, the host's traffic, broadcast and multicast
// included, goes on untouched. A share's frames are those for another MAC
// than the parent's (a macvlan child's), found by MAC or address, and those
// for the parent's own MAC whose destination address is a share's (an
// ipvlan child's).
SEC("tc")
int redirect_ingress(struct __sk_buff *skb)
{
	struct share_key key = { .dir = DIR_INGRESS };
	__u32 ifindex = skb->ifindex;

	// Frames for the node's own MAC are never a share's by MAC, even if
	// a pod forged that MAC as a source and it was learned.
	if (skb->pkt_type != PACKET_OTHERHOST && skb->pkt_type != PACKET_HOST)
		return CARVE_TCX_NEXT;
	// Where the parent's unshared traffic has a class of its own, it
	// goes to the IFB too, whose HTB gives what no share claims to it.
	struct share_val *v = ingress_share(skb, &key, ifindex, skb->pkt_type == PACKET_OTHERHOST);
	if (!v && !unshared_classid(ifindex, DIR_INGRESS))
		return CARVE_TCX_NEXT;
	if (v && v->classid && ack_skips(skb, &key)) {
		count(&key, skb->len);
		return CARVE_TCX_NEXT; // acks.h
	}
	__u32 *ifb = bpf_map_lookup_elem(&ifb_of, &ifindex);
	if (!ifb)
		return CARVE_TCX_NEXT;
	return bpf_redirect(*ifb, 0); // to the IFB's egress, its HTB
}

// On the ingress of a share's own interface (in its pod; the runtime hook
// attaches it): the ingress side's first hook after the IFB's queue, where
// the share's AQM learns each frame's sojourn (aqm.h). Every frame passes.
SEC("tc")
int share_dequeued(struct __sk_buff *skb)
{
	aqm_dequeue(skb);
	return CARVE_TCX_NEXT;
}

// A share's pod guard is two programs. pod_guard is loaded once for each
// share with the share's MAC, parent and VLAN flags in its own data map: it
// only writes them into the frame's cb[] and tail-calls pod_guard_check,
// the policy, loaded once with the classifier and kept in the pinned
// pod_guard_policy. The per-share program verifies in microseconds where
// the whole policy took milliseconds at every prepare (issue 44), and every
// guard runs the newest agent's policy. The data are a section of their
// own, not constants, so that the agent can load guards ahead of the
// prepares that take them (bpf/guardpool.go): it writes the share's values
// and freezes the map before it pins the guard, which leaves them as fixed
// as constants. They are zero in the classifier's own load.
volatile __u8 guard_share_mac[ETH_ALEN] SEC(".data.pod_guard");
volatile __u32 guard_parent SEC(".data.pod_guard");
volatile __u16 guard_flags SEC(".data.pod_guard"); // netns_val's vlan_flags: the share's VLAN, for its addresses

// The cb[] words pod_guard hands pod_guard_check: a magic word, so that
// nothing but pod_guard reaches the policy with a share of its choosing,
// the MAC (four bytes, then two with the flags above them) and the parent.
#define GUARD_CB_MAGIC 0xca7e9a7dU
#define GUARD_POLICY_SLOT 0

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_guard_policy SEC(".maps");

// On the egress of a share's own interface, in its pod (the runtime hook
// attaches it, its link pinned on the host): every frame the pod sends,
// with a socket or none (its kernel's ARP and ND), checked against the
// policy (policy.h) before it reaches the parent.
SEC("tc")
int pod_guard(struct __sk_buff *skb)
{
	// Byte by byte, through volatile: read from the guard's map at run
	// time (an older agent's guards had them as constants, which a load
	// as a whole folded to the zeros they were compiled with).
	skb->cb[0] = GUARD_CB_MAGIC;
	skb->cb[1] = (__u32)guard_share_mac[0] | (__u32)guard_share_mac[1] << 8 | (__u32)guard_share_mac[2] << 16 |
		     (__u32)guard_share_mac[3] << 24;
	skb->cb[2] = (__u32)guard_share_mac[4] | (__u32)guard_share_mac[5] << 8 | (__u32)guard_flags << 16;
	skb->cb[3] = guard_parent;
	bpf_tail_call(skb, &pod_guard_policy, GUARD_POLICY_SLOT);
	// No policy loaded (no agent has opened the classifier since the
	// pins were made): closed.
	return TC_ACT_SHOT;
}

// The policy of every pod guard, reached only by pod_guard's tail call.
SEC("tc")
int pod_guard_check(struct __sk_buff *skb)
{
	if (skb->cb[0] != GUARD_CB_MAGIC)
		return TC_ACT_SHOT;
	__u32 w1 = skb->cb[1], w2 = skb->cb[2];
	__u32 parent = skb->cb[3];
	skb->cb[0] = 0;
	__u8 share[ETH_ALEN] = { w1, w1 >> 8, w1 >> 16, w1 >> 24, w2, w2 >> 8 };
	int reason = spoof_reason(skb, parent, share, w2 >> 16, 1);
	if (reason != SPOOF_OK) {
		count_drop(share, reason);
		return TC_ACT_SHOT;
	}
	return CARVE_TCX_NEXT;
}

// Egress only: keyed by the sending pod's netns, else by source MAC, else
// by source address, like classify_egress.
SEC("tc")
int edt_egress(struct __sk_buff *skb)
{
	struct share_key key = { .dir = DIR_EGRESS };
	struct netns_val *n = netns_share(skb);

	if (n)
		__builtin_memcpy(key.mac, n->mac, ETH_ALEN);
	else if (bpf_skb_load_bytes(skb, ETH_ALEN, key.mac, ETH_ALEN) < 0)
		return CARVE_TCX_NEXT;
	struct share_rate *r = bpf_map_lookup_elem(&share_rates, &key);
	if (!r && !n && addr_owner(skb, skb->ifindex, &key))
		r = bpf_map_lookup_elem(&share_rates, &key);
	if (!r || r->bytes_per_sec == 0)
		return CARVE_TCX_NEXT;
	count(&key, skb->len);

	__u64 now = bpf_ktime_get_ns();
	__u64 delay = (__u64)skb->len * NSEC_PER_SEC / r->bytes_per_sec;
	__u64 next = r->t_last + delay;
	// Concurrent CPUs may both read the same t_last; the share then gets a
	// frame's worth too much, which is what Cilium's bandwidth manager
	// accepts too. A lock would cost more than it saves.
	if (next <= now) {
		r->t_last = now; // idle share: no credit saved up
		return CARVE_TCX_NEXT;
	}
	if (next - now > EDT_HORIZON_NS)
		return TC_ACT_SHOT;
	r->t_last = next;
	if (skb->tstamp < next)
		skb->tstamp = next;
	return CARVE_TCX_NEXT;
}

char __license[] SEC("license") = "Dual BSD/GPL";
