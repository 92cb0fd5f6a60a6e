// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// Included by shaper.c, before classify(): flow isolation inside a share,
// for a kernel with no fq_codel (HTB, bfifo and BPF are all there is). Part
// of the one program object bpf2go builds from shaper.c.
//
// A share with a share_queues entry has, under its HTB class C (its
// classid), a child class for its sparse flows, C + FLOW_SPARSE_CHILD, at
// HTB priority 0, and one for its bulk flows, C + FLOW_BULK_FIRST, at
// priority 1, each with an MTU quantum: HTB serves the sparse child first,
// and both borrow up to the share's rate and no further (the agent makes
// them; netdev/flows.go). The bulk child's bfifo is the bound the share's
// one queue had before, so bulk traffic fares as it did.
//
// A flow (skb->hash) is sparse while it sends at under 1/FLOW_SPARSE_DIV
// of the share's rate: its own virtual clock at that rate stays within
// FLOW_SPARSE_BYTES of now. A ping, a DNS query, an RPC are; a flow that
// turns bulk is past it within a few packets (a GSO burst at once), and
// stays bulk until idle for FLOW_IDLE_NS, so nothing gains priority by
// volume or by pausing, and no flow's frames overtake its own.

#define FLOW_SPARSE_CHILD 1
#define FLOW_BULK_FIRST 2
#define FLOW_BULK_CHILDREN 1
#define FLOW_SPARSE_DIV 16
#define FLOW_SPARSE_BYTES 3028 // two full frames
#define FLOW_IDLE_NS (100ULL * 1000 * 1000)

struct share_queue {
	__u64 bytes_per_sec; // the share's rate, written by the agent
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct share_key);
	__type(value, struct share_queue);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_queues SEC(".maps");

struct flow_key {
	__u8 mac[ETH_ALEN]; // the share's
	__u8 dir;
	__u8 pad;   // always zero
	__u32 hash; // skb->hash
};

struct flow_val {
	__u64 vclock; // the flow's own clock at 1/FLOW_SPARSE_DIV of the share's rate
	__u32 bulk;   // bulk until idle for FLOW_IDLE_NS
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct flow_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_flows SEC(".maps");

struct flow_counters {
	__u64 sparse; // frames sent through the sparse child
	__u64 bulk;   // frames sent through the bulk child
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct share_key);
	__type(value, struct flow_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_flow_stats SEC(".maps");

// flow_count adds a frame to a share's flow counters.
static __always_inline void flow_count(struct share_key *key, int sparse)
{
	struct flow_counters *c = bpf_map_lookup_elem(&share_flow_stats, key);
	if (!c) {
		struct flow_counters init = { .sparse = sparse, .bulk = !sparse };
		if (bpf_map_update_elem(&share_flow_stats, key, &init, BPF_NOEXIST) == 0)
			return;
		c = bpf_map_lookup_elem(&share_flow_stats, key);
		if (!c)
			return;
	}
	c->sparse += sparse; // per CPU, preemption off
	c->bulk += !sparse;
}

// share_flows_classify puts skb, a frame of the share named by key whose
// class is classid, in the child class its flow belongs to (skb->priority).
// A share with no share_queues entry keeps its one class.
static __always_inline void share_flows_classify(struct __sk_buff *skb, struct share_key *key, __u32 classid)
{
	skb->priority = classid;
	struct share_queue *q = bpf_map_lookup_elem(&share_queues, key);
	if (!q || !q->bytes_per_sec)
		return;
	__u64 slow = q->bytes_per_sec / FLOW_SPARSE_DIV;
	if (!slow)
		slow = 1;
	__u64 len = skb->len;
	__u64 now = bpf_ktime_get_ns();
	struct flow_key fk = { .dir = key->dir, .hash = bpf_get_hash_recalc(skb) };
	__builtin_memcpy(fk.mac, key->mac, ETH_ALEN);
	struct flow_val *f = bpf_map_lookup_elem(&share_flows, &fk);
	int sparse;
	if (f) {
		// A bulk flow stays bulk until it has been idle (its clock
		// behind now) for a while: see above.
		if (f->bulk && f->vclock + FLOW_IDLE_NS < now)
			f->bulk = 0;
		__u64 vc = f->vclock > now ? f->vclock : now;
		vc += len * NSEC_PER_SEC / slow;
		f->vclock = vc; // racing CPUs may lose a frame's worth: harmless
		if (vc - now > FLOW_SPARSE_BYTES * NSEC_PER_SEC / slow)
			f->bulk = 1;
		sparse = !f->bulk;
	} else {
		sparse = len <= FLOW_SPARSE_BYTES;
		struct flow_val nf = { .vclock = now + len * NSEC_PER_SEC / slow, .bulk = !sparse };
		bpf_map_update_elem(&share_flows, &fk, &nf, BPF_ANY);
	}
	skb->priority = classid + (sparse ? FLOW_SPARSE_CHILD : FLOW_BULK_FIRST);
	flow_count(key, sparse);
}
