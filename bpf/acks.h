// Pure TCP acknowledgements towards a share skip its ingress queue, within a
// budget (issue 37).
//
// A share's pod that sends hears back about it through acknowledgements on
// the ingress side, and those went through the IFB and the share's ingress
// class with its data: the redirect, the IFB's queue and its softirq, the
// classifier, HTB. With a hundred 10M shares saturating egress on two vCPUs
// that trip decided how fast a paced (BBR) sender learned its frames had
// left, and the shares fell short of their egress rates: 0–14 of 100 within
// 1% with the ACKs shaped, 91–93 with the shares' ingress unshaped, and
// 92–97 with this (netdev/MEASURED.md, "Pure ACKs past the IFB").
//
// What skips is an allow-list: an IPv4 or IPv6 header with TCP straight
// after it (no IPv6 extension header, no fragment), no payload, and of the
// TCP flags ACK and only ACK, ECE and CWR. SYN, FIN, RST, URG, PSH and any
// frame with data go the share's way as before. The frames that skip are
// counted as the share's, and at most 1/ACK_SHARE_DIV of the share's ingress
// rate, in whole frames, skips: a clock per share (ack_clocks) that a frame
// moves on by its length at that fraction of the rate, and that may run at
// most ACK_BURST_FRAMES minimum frames behind now. A frame the clock has no
// room for takes the share's way, so a flood of empty ACKs towards a pod is
// shaped as any other frame past that. A 10M share's budget is 78 KB/s,
// about 1,180 ACKs a second, where a 10M TCP sender is acknowledged about
// 430 times a second (one ACK per two segments) and 860 at most.
//
// Only a flow-isolated share (one with a share_flowsets entry, which holds
// its rate) has the budget; others take the share's way as before.

#define ACK_SHARE_DIV 16
#define ACK_BURST_FRAMES 16
#define ACK_MIN_FRAME 64

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct share_key);
	__type(value, __u64); // the clock, ns (mono)
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ack_clocks SEC(".maps");

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_PSH 0x08
#define TCP_FLAG_ACK 0x10
#define TCP_FLAG_URG 0x20
#define TCP_FLAG_ECE 0x40
#define TCP_FLAG_CWR 0x80

// pure_ack reports whether the frame is an IPv4 or IPv6 TCP segment with no
// payload whose only flags are ACK (set), ECE and CWR. The frame's headers
// must be in the skb's linear data (a pure ACK's always are); a frame whose
// are not is no pure ACK here.
static __always_inline int pure_ack(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	void *l3 = data + ETH_HLEN;
	__u8 *tcp;
	__u32 ip_len, l4_len;

	if (l3 > end)
		return 0;
	__u16 proto = skb->protocol;
	if (proto == bpf_htons(ETH_P_IP)) {
		__u8 *ip = l3;
		if ((void *)(ip + 20) > end)
			return 0;
		if ((ip[0] >> 4) != 4 || ip[9] != 6 /* TCP */)
			return 0;
		// Neither a fragment nor one to follow.
		if (((ip[6] << 8) | ip[7]) & 0x3fff)
			return 0;
		ip_len = (ip[0] & 0x0f) * 4;
		if (ip_len < 20)
			return 0;
		l4_len = ((ip[2] << 8) | ip[3]);
		if (l4_len < ip_len)
			return 0;
		l4_len -= ip_len;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		__u8 *ip = l3;
		if ((void *)(ip + 40) > end)
			return 0;
		if ((ip[0] >> 4) != 6 || ip[6] != 6 /* TCP, no extension header */)
			return 0;
		ip_len = 40;
		l4_len = (ip[4] << 8) | ip[5];
	} else {
		return 0;
	}
	if (ip_len > 60)
		return 0;
	tcp = l3 + ip_len;
	if ((void *)(tcp + 20) > end)
		return 0;
	__u32 doff = (tcp[12] >> 4) * 4;
	if (doff < 20 || l4_len != doff)
		return 0;
	__u8 flags = tcp[13];
	return (flags & TCP_FLAG_ACK) && !(flags & ~(TCP_FLAG_ACK | TCP_FLAG_ECE | TCP_FLAG_CWR));
}

// ack_skips reports whether the frame towards the share key names is a pure
// ACK within the share's budget, and if so spends it.
static __always_inline int ack_skips(struct __sk_buff *skb, struct share_key *key)
{
	if (!pure_ack(skb))
		return 0;
	struct share_flowset *set = bpf_map_lookup_elem(&share_flowsets, key);
	if (!set || !set->c.bytes_per_sec)
		return 0;
	__u64 per = set->c.bytes_per_sec / ACK_SHARE_DIV;
	if (!per)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 cost = (__u64)skb->len * NSEC_PER_SEC / per;
	__u64 burst = (__u64)ACK_BURST_FRAMES * ACK_MIN_FRAME * NSEC_PER_SEC / per;
	__u64 *clock = bpf_map_lookup_elem(&ack_clocks, key);
	if (!clock) {
		__u64 t = (now > burst ? now - burst : 0) + cost;
		bpf_map_update_elem(&ack_clocks, key, &t, BPF_ANY);
		return 1;
	}
	__u64 t = *clock;
	if (t + burst < now)
		t = now - burst; // now > burst here
	t += cost;
	if (t > now)
		return 0;
	*clock = t;
	return 1;
}
