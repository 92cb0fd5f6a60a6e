// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// Included by flows.h: CoDel (RFC 8289) for a share's bulk children, for a
// kernel with no codel or fq_codel qdisc. Part of the one program object
// bpf2go builds from shaper.c.
//
// CoDel acts on the time a frame spent in its queue, known only once the
// frame leaves it. HTB's dequeue runs no program, but every shaped frame
// passes one just after: on egress, return_shaped on the egress shaper's
// peer; on ingress, share_dequeued on the share's own interface in the pod
// (the runtime hook attaches it there), which every frame the IFB lets out
// reaches next. The classifier stamps each frame with when it was queued
// and in which class (aqm_stamp, in skb->tstamp, which HTB, the veth and
// the IFB carry untouched); the program after the queue reads the stamp
// back, clears it, and runs the class's CoDel state machine on the frame's
// sojourn (aqm_dequeue): once frames have stayed over the target for an
// interval, ECN-capable frames are marked CE (checksum fixed), others
// dropped, at the control law's rising pace, until they no longer stay
// over it.
//
// The one departure from RFC 8289: the drop (or mark) the dequeue decides
// is taken by the class's next arriving frame, before it queues
// (aqm_enqueue), not by the frame leaving. That frame has had its turn on
// the link already, which CoDel inside the qdisc would have spared: with 8
// flows on a 10M share, dropping at the head cost them 9-20% of their
// goodput (0.80-0.87 of the limit, against 0.955 dropping on arrival, in
// BenchmarkLatencyUnderLoad). The sender learns a sojourn later, which the
// target keeps short.
//
// A frame in one of N busy bulk children waits for a frame of each of the
// others per HTB round, one MTU each: at 10 Mbit/s and 8 flows that is
// 9.7 ms with a single frame queued per flow, and TCP keeps at least two
// in flight. The target is therefore AQM_TARGET_NS or 2.5 MTU times per
// busy child, whichever is larger (as CAKE raises its target to 1.5 MTU
// times on a slow link): 8 flows on 10M cannot queue less than 19 ms (two
// frames each), which 1.5 MTU times a child would put over the target for
// good. A GSO or GRO super-packet is a round's frame too (the children take
// them whole since issue 37): the frame leaving sets the round where it is
// longer than an MTU, so that one 64 KiB super-packet (52 ms at 10M) is not
// read as a standing queue.
//
#define AQM_TARGET_NS (5ULL * 1000 * 1000)
#define AQM_INTERVAL_NS (100ULL * 1000 * 1000)
#define AQM_ROUND_FRAME 1514 // the frame of round_ns (bpf/flows.go's aqmRoundFrame)
#define AQM_ACTIVE_NS (50ULL * 1000 * 1000) // a bulk child is busy if it got a frame this recently

// The stamp, in skb->tstamp with the monotonic clock type: bit 63 set (no
// monotonic time has it), the time in units of 2^16 ns (65.5 us, 23 bits,
// wrapping every 549 s), the ifindex of the device holding the class (24
// bits) and the class's minor (16 bits).
#define AQM_STAMP_BIT (1ULL << 63)
#define AQM_TIME_SHIFT 16
#define AQM_TIME_MASK 0x7fffffULL
#define AQM_IFINDEX_MASK 0xffffffULL

struct aqm_key {
	__u32 ifindex; // the device holding the class: an egress shaper, an IFB
	__u16 minor;   // the class, a bulk child of a share
	__u16 pad;     // always zero
};

// A bulk child's CoDel state, made by the agent with the share's children
// and removed with them.
struct aqm_val {
	struct share_key share; // whose counters and children
	__u64 round_ns;         // 2.5 MTU times at the share's rate: the target per busy child
	__u64 first_above;      // CoDel's first_above_time; 0: under the target
	__u64 drop_next;        // when the next drop or mark is due, while dropping
	__u64 last_dequeue;     // when a frame of the class last left its queue
	__u64 target_ns;        // the target then
	__u32 count;            // drops and marks since dropping began
	__u32 lastcount;        // count when dropping last ended
	__u16 dropping;         // CoDel's dropping state
	__u16 owed;             // a drop or mark due, left to the next arrival (aqm_enqueue)
	__u32 rec_inv_sqrt;     // 1/sqrt(count), Q0.16 (aqm_newton_step)
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct aqm_key);
	__type(value, struct aqm_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} aqm_state SEC(".maps");

struct aqm_counters {
	__u64 drops; // frames the AQM dropped
	__u64 marks; // frames it marked CE instead
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct share_key);
	__type(value, struct aqm_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_aqm_stats SEC(".maps");

// aqm_stamp records on skb that it is queued now in class 1:minor (the
// low 16 bits of classid) of ifindex.
static __always_inline void aqm_stamp(struct __sk_buff *skb, __u32 ifindex, __u32 classid, __u64 now)
{
	__u64 ts = AQM_STAMP_BIT | (((now >> AQM_TIME_SHIFT) & AQM_TIME_MASK) << 40) |
		   (((__u64)ifindex & AQM_IFINDEX_MASK) << 16) | (classid & 0xffff);
	bpf_skb_set_tstamp(skb, ts, BPF_SKB_TSTAMP_DELIVERY_MONO);
}

static __always_inline void aqm_count(struct share_key *key, int mark)
{
	struct aqm_counters *c = bpf_map_lookup_elem(&share_aqm_stats, key);
	if (!c) {
		struct aqm_counters init = { .drops = !mark, .marks = mark };
		if (bpf_map_update_elem(&share_aqm_stats, key, &init, BPF_NOEXIST) == 0)
			return;
		c = bpf_map_lookup_elem(&share_aqm_stats, key);
		if (!c)
			return;
	}
	c->drops += !mark; // per CPU, preemption off
	c->marks += mark;
}

// 1/sqrt(count) is kept as the Linux codel qdisc keeps it: Q0.16 in
// rec_inv_sqrt, one Newton step per change of count, so the verifier sees
// arithmetic and no loop.
#define AQM_REC_INV_SQRT_SHIFT 16
#define AQM_REC_INV_SQRT_ONE (~0U >> AQM_REC_INV_SQRT_SHIFT)

static __always_inline void aqm_newton_step(struct aqm_val *a)
{
	__u32 invsqrt = a->rec_inv_sqrt << AQM_REC_INV_SQRT_SHIFT;
	__u32 invsqrt2 = ((__u64)invsqrt * invsqrt) >> 32;
	__u64 val = (3ULL << 32) - ((__u64)a->count * invsqrt2);
	val >>= 2; // no overflow in the next multiply
	val = (val * invsqrt) >> (32 - 2 + 1);
	a->rec_inv_sqrt = val >> AQM_REC_INV_SQRT_SHIFT;
}

// aqm_control_law is when the next drop is due after one at t: an
// interval over the square root of count later.
static __always_inline __u64 aqm_control_law(__u64 t, struct aqm_val *a)
{
	return t + ((AQM_INTERVAL_NS * ((__u64)a->rec_inv_sqrt << AQM_REC_INV_SQRT_SHIFT)) >> 32);
}

// aqm_mark sets CE on an ECN-capable IPv4 or IPv6 frame and says whether
// it is marked now. The frame's Ethernet header is at offset 0, as at the
// tc hooks.
static __always_inline int aqm_mark(struct __sk_buff *skb)
{
	__u16 proto;
	if (bpf_skb_load_bytes(skb, 12, &proto, sizeof(proto)) < 0)
		return 0;
	if (proto == bpf_htons(ETH_P_IP)) {
		__u8 head[2]; // version and header length, TOS
		if (bpf_skb_load_bytes(skb, ETH_HLEN, head, sizeof(head)) < 0)
			return 0;
		if (!(head[1] & 3))
			return 0; // Not-ECT
		if ((head[1] & 3) == 3)
			return 1;
		__u16 before, after;
		__builtin_memcpy(&before, head, 2);
		head[1] |= 3;
		__builtin_memcpy(&after, head, 2);
		if (bpf_l3_csum_replace(skb, ETH_HLEN + 10, before, after, sizeof(after)) < 0)
			return 0;
		return bpf_skb_store_bytes(skb, ETH_HLEN + 1, &head[1], 1, 0) == 0;
	}
	if (proto == bpf_htons(ETH_P_IPV6)) {
		__u8 b; // the traffic class's low nibble, ECN in its low two bits
		if (bpf_skb_load_bytes(skb, ETH_HLEN + 1, &b, 1) < 0)
			return 0;
		if (!(b & 0x30))
			return 0;
		if ((b & 0x30) == 0x30)
			return 1;
		b |= 0x30;
		return bpf_skb_store_bytes(skb, ETH_HLEN + 1, &b, 1, 0) == 0;
	}
	return 0;
}

// A drop or mark the dequeue owes a bulk child is hinted in bit 0 of the
// child's last[] time in its share's share_flowsets entry, which the
// classifier reads for every frame anyway: only a frame of a child with the
// hint looks up the child's CoDel state (aqm_enqueue). A hint lost to a
// race costs a drop; a stale one, a lookup. An older classifier never sets
// or reads it.
#define AQM_OWED_HINT 1ULL

// aqm_busy is how many of the share's bulk children got a frame lately, at
// least 1, and the share's rate in bytes/s (0: unknown).
static __always_inline __u32 aqm_busy(struct bulk_children *c, __u64 now)
{
	__u32 n = 0;
	if (!c)
		return 1;
#pragma unroll
	for (int i = 0; i < FLOW_BULK_CHILDREN; i++)
		n += c->last[i] + AQM_ACTIVE_NS >= now;
	return n ? n : 1;
}

// aqm_owe hints to the classifier that the bulk child of minor (its offset
// in the share's aligned block of 16 minors) is owed a drop or mark.
static __always_inline void aqm_owe(struct bulk_children *c, __u16 minor)
{
	__u32 i = (minor & 0xf) - FLOW_BULK_FIRST;
	if (c && i < FLOW_BULK_CHILDREN)
		c->last[i] |= AQM_OWED_HINT;
}

// aqm_act marks skb CE where it is ECN-capable and counts what it did; it
// says whether to drop skb instead (1).
static __always_inline int aqm_act(struct __sk_buff *skb, struct aqm_val *a)
{
	int marked = aqm_mark(skb);
	aqm_count(&a->share, marked);
	return !marked;
}

// aqm_dequeue runs a stamped frame's class's CoDel as the frame leaves the
// queue, and clears the stamp; the frame always goes on. Frames with no
// stamp of ours, and those of a class with no CoDel state (a share with no
// bulk children, a sparse child), are not looked at.
static __always_inline void aqm_dequeue(struct __sk_buff *skb)
{
	// Reading tstamp_type makes the kernel hand this program skb->tstamp
	// as it is at ingress, where it would otherwise read a monotonic
	// stamp as 0. The stamp's own bit says it is ours, whatever the type
	// (BPF_PROG_RUN cannot set one), so long as it is a time's.
	__u8 type = skb->tstamp_type;
	__u64 ts = skb->tstamp;
	if (!(ts & AQM_STAMP_BIT) || type > BPF_SKB_TSTAMP_DELIVERY_MONO)
		return;
	// What follows the queue must not read our stamp as a departure or
	// receive time.
	bpf_skb_set_tstamp(skb, 0, BPF_SKB_TSTAMP_UNSPEC);
	struct aqm_key k = { .ifindex = (ts >> 16) & AQM_IFINDEX_MASK, .minor = ts & 0xffff };
	struct aqm_val *a = bpf_map_lookup_elem(&aqm_state, &k);
	if (!a)
		return;
	__u64 now = bpf_ktime_get_ns();
	__u64 sojourn = ((((now >> AQM_TIME_SHIFT) & AQM_TIME_MASK) - ((ts >> 40) & AQM_TIME_MASK)) & AQM_TIME_MASK)
			<< AQM_TIME_SHIFT;
	struct share_flowset *set = bpf_map_lookup_elem(&share_flowsets, &a->share);
	struct bulk_children *c = set ? &set->c : NULL;
	__u64 bps = c ? c->bytes_per_sec : 0;
	__u32 busy = aqm_busy(c, now);
	// A GSO or GRO super-packet is a round's frame too: each busy child
	// holds at least one.
	__u64 round = a->round_ns;
	if (bps && skb->len > AQM_ROUND_FRAME) {
		__u64 r = (__u64)skb->len * NSEC_PER_SEC * 5 / 2 / bps;
		if (r > round)
			round = r;
	}
	__u64 target = round * busy;
	if (target < AQM_TARGET_NS)
		target = AQM_TARGET_NS;
	a->last_dequeue = now;
	a->target_ns = target;

	// RFC 8289's dequeue, a frame at a time (a dropped frame's successor
	// is judged as it leaves). Racing CPUs may both act on a frame's
	// worth of state: at worst a drop more or fewer.
	int ok_to_drop = 0;
	if (sojourn < target)
		a->first_above = 0;
	else if (!a->first_above)
		a->first_above = now + AQM_INTERVAL_NS;
	else if (now >= a->first_above)
		ok_to_drop = 1;
	int due = 0;
	if (a->dropping) {
		if (!ok_to_drop) {
			a->dropping = 0;
			a->owed = 0;
		} else if (now >= a->drop_next) {
			due = 1;
			a->count++;
			aqm_newton_step(a);
			a->drop_next = aqm_control_law(a->drop_next, a);
		}
	} else if (ok_to_drop) {
		due = 1;
		a->dropping = 1;
		// Dropping again soon after the last time: at about the
		// pace it ended with.
		__u32 delta = a->count - a->lastcount;
		if (delta > 1 && (__s64)(now - a->drop_next) < (__s64)(16 * AQM_INTERVAL_NS)) {
			a->count = delta;
			aqm_newton_step(a);
		} else {
			a->count = 1;
			a->rec_inv_sqrt = AQM_REC_INV_SQRT_ONE;
		}
		a->lastcount = a->count;
		a->drop_next = aqm_control_law(now, a);
	}
	if (due) {
		a->owed = 1; // for the class's next arriving frame
		aqm_owe(c, k.minor);
	}
}

// aqm_enqueue takes, on skb arriving for class 1:minor of ifindex, the
// drop or mark that the class's dequeue owes. It says whether to drop skb
// (1).
static __always_inline int aqm_enqueue(struct __sk_buff *skb, __u32 ifindex, __u16 minor, __u64 now)
{
	struct aqm_key k = { .ifindex = ifindex & AQM_IFINDEX_MASK, .minor = minor };
	struct aqm_val *a = bpf_map_lookup_elem(&aqm_state, &k);
	if (!a)
		return 0;
	// No frame of the class has left for a target's time: its queue has
	// emptied since, and what the last one said is moot.
	if (now - a->last_dequeue > a->target_ns) {
		a->owed = 0;
		return 0;
	}
	if (!a->owed)
		return 0;
	a->owed = 0;
	return aqm_act(skb, a);
}
