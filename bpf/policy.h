// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// What a pod's frame may be: one allow-list, checked where the pod's frames
// leave its own interface (pod_guard, in the pod, every frame with or
// without a socket) and again on the parent (classify_egress, for frames
// known by the sending socket's namespace or by a guarded share's MAC).
// Included by shaper.c after the maps it reads; `make generate` after
// changing it. What passes:
//
//   - towards any destination but an IEEE 802.1 link-local group
//     (01:80:c2:00:00:00/44: STP, PAUSE, LACP, EAPOL, LLDP);
//   - from the share's MAC (an allowMACChange class: up to LEARN_CAP others,
//     learned for its ingress, never another share's or the node's own;
//     the parent's own for an ipvlan child);
//   - with no VLAN tag but the share's own VLAN's, which its VLAN device on
//     the host adds (in the pod: none at all);
//   - IPv4, ARP and IPv6, and the ethertypes the share's class lists
//     (share_ethertypes: frames of those are not looked into);
//   - IPv6 whose extension headers end within a few, with no router
//     advertisement or redirect (unless the class lets its pods route:
//     NETNS_ALLOW_ROUTER), and no fragmented or malformed neighbour
//     discovery, whose link-layer address options are the frame's own MAC;
//   - IPv6 from, and neighbour advertisements for, no link-local address
//     but the one the frame's MAC makes (EUI-64);
//   - for a share given addresses of a family: IPv4 from them (0.0.0.0 only
//     for a DHCP client's request), ARP sent by the frame's own MAC for
//     them (0.0.0.0: a probe), IPv6 from them, its own link-local or the
//     unspecified address, and neighbour advertisements only for those.

// allowed reports whether the share named by mac may use addr (family 4 or
// 6, 4 or 16 bytes) on parent, in its VLAN vlan (0 for none): the same
// address may be two shares' in two VLANs of one parent.
static __always_inline int allowed(__u32 parent, __u16 vlan, __u8 family, const __u8 *addr, const __u8 *mac)
{
	struct addr_key k = { .ifindex = parent, .family = family, .vlan = vlan };
	if (family == 4)
		__builtin_memcpy(k.addr, addr, 4);
	else
		__builtin_memcpy(k.addr, addr, 16);
	struct addr_owner *o = bpf_map_lookup_elem(&allowed_addrs, &k);
	return o && mac_eq(o->mac, mac);
}

// ip6_link_local reports an address in fe80::/10.
static __always_inline int ip6_link_local(const __u8 *a)
{
	return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

// ip6_own is an IPv6 address a frame from src may carry as its own without
// it being one of the share's: the unspecified address (duplicate address
// detection) and the link-local address the pod's kernel makes from src
// (fe80::/64 and src's EUI-64; the hook sets the interface's address
// generation to it). Another link-local address, a router's above all,
// is never a share's to claim.
static __always_inline int ip6_own(const __u8 *a, const __u8 *src)
{
	if (ip6_link_local(a))
		return a[1] == 0x80 && !(a[2] | a[3] | a[4] | a[5] | a[6] | a[7]) && a[8] == (src[0] ^ 0x02) && a[9] == src[1] &&
		       a[10] == src[2] && a[11] == 0xff && a[12] == 0xfe && a[13] == src[3] && a[14] == src[4] && a[15] == src[5];
	for (int i = 0; i < 16; i++)
		if (a[i])
			return 0;
	return 1;
}

// ip6_may_use is whether a frame from src of the share may carry a: its
// own (ip6_own) always; where check (the share was given IPv6 addresses)
// one of them; else any but another's link-local (SLAAC's are the pod's).
static __always_inline int ip6_may_use(const __u8 *a, const __u8 *src, int check, __u32 parent, __u16 vlan, const __u8 *share)
{
	if (ip6_own(a, src))
		return 1;
	if (check)
		return allowed(parent, vlan, 6, a, share);
	return !ip6_link_local(a);
}

#define IPV6_EXT_MAX 4 // extension headers walked before giving up
#define ND_OPTS_MAX 3  // neighbour discovery options checked

// icmp6_reason checks an ICMPv6 message at off (its type first) that a
// share sent from src (the frame's MAC): no router advertisement (134) or
// redirect (137) unless router, and in neighbour discovery (133 to 136) a
// target (136) that is the share's and link-layer options (1, 2) that are
// src. end is where the IPv6 payload ends: what follows is the frame's
// padding.
static __always_inline int icmp6_reason(struct __sk_buff *skb, __u32 off, __u32 end, __u32 parent, __u16 vlan, const __u8 *share, const __u8 *src,
					int check, int router)
{
	__u8 icmp[24]; // type, code, checksum, flags or reserved, target
	if (bpf_skb_load_bytes(skb, off, icmp, 4) < 0)
		return SPOOF_ND;
	if ((icmp[0] == 134 || icmp[0] == 137) && !router)
		return SPOOF_ROUTER;
	if (icmp[0] < 133 || icmp[0] > 136)
		return SPOOF_OK;
	__u32 opts = off + 8; // router solicitation: options after 8 bytes
	if (icmp[0] == 134)
		opts = off + 16; // an advertisement a router's pod may send: after 16
	if (icmp[0] == 135 || icmp[0] == 136) {
		if (bpf_skb_load_bytes(skb, off, icmp, sizeof(icmp)) < 0)
			return SPOOF_ND;
		// A solicitation asks about another's address; an
		// advertisement claims its target.
		if (icmp[0] == 136 && !ip6_may_use(icmp + 8, src, check, parent, vlan, share))
			return SPOOF_ND;
		opts = off + 24;
	}
#pragma unroll
	for (int i = 0; i < ND_OPTS_MAX; i++) {
		__u8 opt[8]; // type, length (8-byte units), link-layer address
		if (opts >= end)
			return SPOOF_OK; // no more options
		if (bpf_skb_load_bytes(skb, opts, opt, 2) < 0)
			return SPOOF_ND;
		if (opt[1] == 0)
			return SPOOF_ND; // RFC 4861: a zero length is invalid
		if (opt[0] == 1 || opt[0] == 2) {
			if (opt[1] != 1 || bpf_skb_load_bytes(skb, opts, opt, 8) < 0 || !mac_eq(opt + 2, src))
				return SPOOF_ND;
		}
		opts += (__u32)opt[1] * 8;
	}
	return SPOOF_OK;
}

// ip6_reason checks an IPv6 packet at off: where check (the share has
// addresses of the family) its source, then past its extension headers (a few; a
// fragment header ahead of ICMPv6 is refused, as RFC 6980 forbids
// fragmented neighbour discovery) its ICMPv6 message; router: router
// advertisements and redirects may pass.
static __always_inline int ip6_reason(struct __sk_buff *skb, __u32 off, __u32 parent, __u16 vlan, const __u8 *share, const __u8 *src, int check,
				      int router)
{
	__u8 ip6[40];
	if (bpf_skb_load_bytes(skb, off, ip6, sizeof(ip6)) < 0)
		return SPOOF_SRC_IP;
	if (!ip6_may_use(ip6 + 8, src, check, parent, vlan, share))
		return SPOOF_SRC_IP;
	__u8 next = ip6[6];
	__u32 at = off + 40;
	int fragmented = 0;
#pragma unroll
	for (int i = 0; i < IPV6_EXT_MAX; i++) {
		if (next != 0 && next != 43 && next != 44 && next != 60)
			break;
		__u8 ext[2]; // next header, length
		if (bpf_skb_load_bytes(skb, at, ext, sizeof(ext)) < 0)
			return SPOOF_IPV6_HEADERS;
		if (next == 44) {
			fragmented = 1;
			at += 8;
		} else {
			at += ((__u32)ext[1] + 1) * 8;
		}
		next = ext[0];
	}
	if (next == 0 || next == 43 || next == 44 || next == 60)
		return SPOOF_IPV6_HEADERS;
	if (next != 58)
		return SPOOF_OK;
	if (fragmented)
		return SPOOF_ND;
	__u32 end = off + 40 + (((__u32)ip6[4] << 8) | ip6[5]);
	return icmp6_reason(skb, at, end, parent, vlan, share, src, check, router);
}

// dhcp_request reports whether the IPv4 packet at off is UDP from port 68
// to port 67: a DHCP client's, which may come from 0.0.0.0.
static __always_inline int dhcp_request(struct __sk_buff *skb, __u32 off)
{
	__u8 ip[20];
	if (bpf_skb_load_bytes(skb, off, ip, sizeof(ip)) < 0 || ip[9] != 17)
		return 0;
	__u16 ports[2];
	if (bpf_skb_load_bytes(skb, off + (ip[0] & 0x0f) * 4, ports, sizeof(ports)) < 0)
		return 0;
	return ports[0] == bpf_htons(68) && ports[1] == bpf_htons(67);
}

// spoof_reason checks a frame a pod sent through its share on parent
// against the policy above. The share is named by share; guard is its
// netns_val's vlan_flags, with the share's VLAN, in which its addresses
// are recorded. in_pod: the frame is on the share's own interface in its
// pod, where it may carry no tag at all (the host's VLAN device adds it).
// SPOOF_OK, or why it must be dropped.
static __always_inline int spoof_reason(struct __sk_buff *skb, __u32 parent, const __u8 *share, __u16 guard, int in_pod)
{
	__u8 eth[ETH_HLEN];
	__u16 share_vlan = guard & NETNS_VLAN_MASK;
	__u16 vlan = in_pod ? 0 : share_vlan; // the tag the frame must carry
	__u16 flags = guard >> NETNS_FLAGS_SHIFT;

	if (bpf_skb_load_bytes(skb, 0, eth, ETH_HLEN) < 0)
		return SPOOF_OK; // nothing a runt can claim
	if (eth[0] == 0x01 && eth[1] == 0x80 && eth[2] == 0xc2 && eth[3] == 0 && eth[4] == 0 && (eth[5] & 0xf0) == 0)
		return SPOOF_LINK_LOCAL;
	if (!mac_eq(eth + ETH_ALEN, share)) {
		struct learned_key lk = {};
		__builtin_memcpy(lk.mac, eth + ETH_ALEN, ETH_ALEN);
		__u32 *local = bpf_map_lookup_elem(&local_macs, &lk);
		if (local && *local == parent && by_addr(share)) {
			// An ipvlan child sends with its parent's MAC.
		} else if (!(flags & NETNS_ALLOW_MAC_CHANGE) || !learn(eth + ETH_ALEN, parent, share)) {
			return SPOOF_SRC_MAC;
		}
	}
	__u16 proto = *(__u16 *)(eth + 2 * ETH_ALEN);
	__u32 off = ETH_HLEN;
	if (skb->vlan_present) {
		// The tag the share's VLAN device put in the skb's metadata.
		if (!vlan || (skb->vlan_tci & 0x0fff) != vlan)
			return SPOOF_VLAN;
	} else if (vlan) {
		// ... or in the frame, where the parent cannot offload it.
		__u16 tci;
		if (proto != bpf_htons(ETH_P_8021Q) || bpf_skb_load_bytes(skb, ETH_HLEN, &tci, 2) < 0 ||
		    (bpf_ntohs(tci) & 0x0fff) != vlan || bpf_skb_load_bytes(skb, ETH_HLEN + 2, &proto, 2) < 0)
			return SPOOF_VLAN;
		off += 4;
	}
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD))
		return SPOOF_VLAN;
	if (proto != bpf_htons(ETH_P_IP) && proto != bpf_htons(ETH_P_ARP) && proto != bpf_htons(ETH_P_IPV6)) {
		struct ethertype_key ek = { .parent = parent, .proto = proto };
		__builtin_memcpy(ek.mac, share, ETH_ALEN);
		return bpf_map_lookup_elem(&share_ethertypes, &ek) ? SPOOF_OK : SPOOF_ETHERTYPE;
	}
	if (proto == bpf_htons(ETH_P_IP) && (flags & NETNS_CHECK_IPV4)) {
		__u8 src[4];
		if (bpf_skb_load_bytes(skb, off + 12, src, 4) < 0)
			return SPOOF_SRC_IP;
		if ((src[0] | src[1] | src[2] | src[3]) == 0)
			return dhcp_request(skb, off) ? SPOOF_OK : SPOOF_SRC_IP;
		return allowed(parent, share_vlan, 4, src, share) ? SPOOF_OK : SPOOF_SRC_IP;
	}
	if (proto == bpf_htons(ETH_P_ARP) && (flags & NETNS_CHECK_IPV4)) {
		// htype, ptype, hlen, plen, oper, sha[6], spa[4]
		__u8 arp[18];
		if (bpf_skb_load_bytes(skb, off, arp, sizeof(arp)) < 0)
			return SPOOF_ARP;
		if (arp[2] != 0x08 || arp[3] != 0x00 || arp[4] != ETH_ALEN || arp[5] != 4)
			return SPOOF_ARP; // not Ethernet/IPv4: nothing a share sends
		if (!mac_eq(arp + 8, eth + ETH_ALEN))
			return SPOOF_ARP; // the sender MAC is the frame's own, checked above
		if ((arp[14] | arp[15] | arp[16] | arp[17]) == 0) // an ARP probe
			return SPOOF_OK;
		return allowed(parent, share_vlan, 4, arp + 14, share) ? SPOOF_OK : SPOOF_ARP;
	}
	if (proto == bpf_htons(ETH_P_IPV6))
		return ip6_reason(skb, off, parent, share_vlan, share, eth + ETH_ALEN, flags & NETNS_CHECK_IPV6, flags & NETNS_ALLOW_ROUTER);
	return SPOOF_OK;
}
