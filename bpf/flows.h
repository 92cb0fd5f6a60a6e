// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// Included by shaper.c, before classify(): flow isolation inside a share,
// for a kernel with no fq_codel (HTB, bfifo and BPF are all there is). Part
// of the one program object bpf2go builds from shaper.c.
//
// A share with a share_queues entry has, under its HTB class C (its
// classid), a child class for its sparse flows, C + FLOW_SPARSE_CHILD, at
// HTB priority 0, and FLOW_BULK_CHILDREN for its bulk flows, C +
// FLOW_BULK_FIRST on, at priority 1, each with an MTU quantum: HTB serves
// the sparse child first and the bulk children round-robin, a frame each
// turn, and all of them borrow up to the share's rate and no further (the
// agent makes them; netdev/flows.go).
//
// A flow (skb->hash) is sparse while it sends at under 1/FLOW_SPARSE_DIV
// of the share's rate: its own virtual clock at that rate stays within
// FLOW_SPARSE_BYTES of now. A ping, a DNS query, an RPC are; a flow that
// turns bulk is past it within a few packets (a GSO burst at once), and
// stays bulk until idle for FLOW_IDLE_NS, so nothing gains priority by
// volume or by pausing, and no flow's frames overtake its own.
//
// A flow that turns bulk is given a bulk child of its own while one is
// idle (share_flowsets), else the next in turn, and keeps it until it goes
// idle: unlike a hash of the flow, eight flows get eight children, so each
// gets an equal part of the share. The children's queues are kept short
// by the AQM in aqm.h, which needs each frame stamped with the class it
// went to (aqm_stamp).
#define FLOW_SPARSE_CHILD 1
#define FLOW_BULK_FIRST 2
#define FLOW_BULK_CHILDREN 8
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
	__u32 child;  // its bulk child, 1-based; 0: none yet (and an older carve's entries)
};

// A share's bulk children, written by the agent with the share's
// share_queues entry (an older agent's shares have none: all their bulk
// flows share FLOW_BULK_FIRST, unstamped).
struct bulk_children {
	__u64 bytes_per_sec;                 // the share's rate
	__u64 last[FLOW_BULK_CHILDREN];      // when each bulk child last got a frame
	__u32 next;                          // where the search for an idle child starts
	__u32 class_ifindex;                 // the device that holds the share's class (egress shaper, IFB)
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct share_key);
	__type(value, struct bulk_children);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_children SEC(".maps");

// A share's flows, the first FLOW_SLOTS of them, are kept in its own
// entry (share_flowsets), beside its children: the frame of a flow in a
// slot costs no lookup of its own. A flow (skb->hash) has two places, by
// two parts of its hash; it takes one where that slot is free or its flow
// is idle (its clock FLOW_IDLE_NS behind now). A flow that finds neither, and every
// flow of hash 0, is kept in share_flows as before. Which of the two holds
// a flow is settled by its first frame, and it stays there: a flow's frames
// look in its two slots first, then in share_flows.
//
// With share_flows alone a flow-isolated share's frame cost 1.36-1.42 times
// a plain share's, of which the flow's own lookup was about 0.2
// (BenchmarkClassifyFlowsOverPlain).
#define FLOW_SLOTS 16 // a power of two

struct flow_slot {
	__u32 hash;  // the flow's skb->hash; 0: free
	__u16 bulk;  // as flow_val's
	__u16 child; // as flow_val's
	__u64 vclock; // also what frees the slot: flow_slot_free
};

// share_flowsets replaces share_children for this build's programs (a
// value of another size cannot share the pinned map): the agent writes
// both, share_children for an older agent after a rollback, and copies an
// older agent's share_children entries here when it opens the maps
// (OpenShaper).
struct share_flowset {
	struct bulk_children c;
	struct flow_slot slots[FLOW_SLOTS];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct share_key);
	__type(value, struct share_flowset);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_flowsets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct flow_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_flows SEC(".maps");

// The AQM of the bulk children: aqm_stamp, aqm_enqueue, aqm_dequeue.
#include "aqm.h"

// bulk_child picks a bulk child for a flow that turned bulk: the first idle
// one from c->next on, else c->next itself. 0-based.
static __always_inline __u32 bulk_child(struct bulk_children *c, __u64 now)
{
	__u32 start = c->next % FLOW_BULK_CHILDREN;
	__u32 pick = start;
#pragma unroll
	for (__u32 j = 0; j < FLOW_BULK_CHILDREN; j++) {
		__u32 i = (start + j) % FLOW_BULK_CHILDREN;
		if (c->last[i] + FLOW_IDLE_NS < now) {
			pick = i;
			break;
		}
	}
	c->next = (pick + 1) % FLOW_BULK_CHILDREN;
	return pick;
}

// flow_slot_of is the slot of share set that holds the flow of hash, or
// NULL where neither of its two does.
static __always_inline struct flow_slot *flow_slot_of(struct share_flowset *set, __u32 hash)
{
	if (!hash)
		return NULL;
	struct flow_slot *a = &set->slots[hash & (FLOW_SLOTS - 1)];
	if (a->hash == hash)
		return a;
	struct flow_slot *b = &set->slots[(hash >> 16) & (FLOW_SLOTS - 1)];
	if (b->hash == hash)
		return b;
	return NULL;
}

// flow_slot_free is a slot of set the new flow of hash may take: one of its
// two that is free or whose flow is idle by flow_step's own rule (its clock
// behind now by FLOW_IDLE_NS), so that a flow loses nothing to the new one
// that it would not have lost anyway (a bulk flow keeps its child while its
// clock is ahead, however long it pauses); NULL where both are busy.
static __always_inline struct flow_slot *flow_slot_free(struct share_flowset *set, __u32 hash, __u64 now)
{
	if (!hash)
		return NULL;
	struct flow_slot *a = &set->slots[hash & (FLOW_SLOTS - 1)];
	if (!a->hash || a->vclock + FLOW_IDLE_NS < now)
		return a;
	struct flow_slot *b = &set->slots[(hash >> 16) & (FLOW_SLOTS - 1)];
	if (!b->hash || b->vclock + FLOW_IDLE_NS < now)
		return b;
	return NULL;
}

// flow_step advances a known flow's clock by a frame of len bytes at
// byte_ns (1/256 ns a byte) and says whether it is bulk now; *child is
// cleared where the flow went idle and turned sparse again.
static __always_inline void flow_step(__u64 *vclock, __u16 *bulk, __u16 *child, __u64 len, __u64 byte_ns, __u64 now)
{
	// A bulk flow stays bulk until it has been idle (its clock behind
	// now) for a while: see above.
	if (*bulk && *vclock + FLOW_IDLE_NS < now) {
		*bulk = 0;
		*child = 0;
	}
	__u64 vc = *vclock > now ? *vclock : now;
	vc += (len * byte_ns) >> 8;
	*vclock = vc; // racing CPUs may lose a frame's worth: harmless
	if (vc - now > ((FLOW_SPARSE_BYTES * byte_ns) >> 8))
		*bulk = 1;
}

// share_flows_classify puts skb, a frame of the share named by key whose
// class is classid, in the child class its flow belongs to (skb->priority),
// and stamps it for the AQM where the share has bulk children. A share
// with no share_queues entry keeps its one class. It returns 1 where the
// AQM drops skb, else 0.
static __always_inline int share_flows_classify(struct __sk_buff *skb, struct share_key *key, __u32 classid)
{
	skb->priority = classid;
	__u64 bps;
	struct share_flowset *set = bpf_map_lookup_elem(&share_flowsets, key);
	struct bulk_children *c = NULL;
	if (set) {
		c = &set->c;
		bps = c->bytes_per_sec;
	} else {
		struct share_queue *q = bpf_map_lookup_elem(&share_queues, key);
		if (!q)
			return 0;
		bps = q->bytes_per_sec;
	}
	if (!bps)
		return 0;
	__u64 slow = bps / FLOW_SPARSE_DIV;
	if (!slow)
		slow = 1;
	// A byte's time at the flow's clock rate, in 1/256 ns: one division a
	// frame, not one per use.
	__u64 byte_ns = (NSEC_PER_SEC << 8) / slow;
	__u64 len = skb->len;
	__u64 now = bpf_ktime_get_ns();
	__u32 hash = bpf_get_hash_recalc(skb);
	__u16 bulk, *childp;
	struct flow_slot *slot = set ? flow_slot_of(set, hash) : NULL;
	struct flow_val *f = NULL;
	struct flow_val nf = {};
	struct flow_key fk = {};
	if (slot) {
		flow_step(&slot->vclock, &slot->bulk, &slot->child, len, byte_ns, now);
		bulk = slot->bulk;
		childp = &slot->child;
	} else {
		fk.dir = key->dir;
		fk.hash = hash;
		__builtin_memcpy(fk.mac, key->mac, ETH_ALEN);
		f = bpf_map_lookup_elem(&share_flows, &fk);
		if (f) {
			__u16 b = f->bulk, ch = f->child;
			flow_step(&f->vclock, &b, &ch, len, byte_ns, now);
			f->bulk = b;
			f->child = ch;
			bulk = b;
			childp = NULL;
		} else {
			// A new flow: a slot of its share's where one is free,
			// else an entry of its own.
			slot = set ? flow_slot_free(set, hash, now) : NULL;
			__u16 b = len > FLOW_SPARSE_BYTES;
			if (slot) {
				slot->vclock = now + ((len * byte_ns) >> 8);
				slot->bulk = b;
				slot->child = 0;
				slot->hash = hash;
				childp = &slot->child;
			} else {
				nf.vclock = now + ((len * byte_ns) >> 8);
				nf.bulk = b;
				f = &nf;
				childp = NULL;
			}
			bulk = b;
		}
	}
	__u32 child = FLOW_SPARSE_CHILD;
	int owed = 0;
	if (bulk) {
		child = FLOW_BULK_FIRST;
		if (c) {
			__u32 i = childp ? *childp : f->child;
			if (i < 1 || i > FLOW_BULK_CHILDREN) {
				i = bulk_child(c, now) + 1;
				if (childp)
					*childp = i;
				else
					f->child = i;
			}
			i -= 1;
			if (i < FLOW_BULK_CHILDREN) { // for the verifier
				// Bit 0 is the AQM's hint that it owes the
				// child a drop (aqm_owe); the time keeps the
				// rest.
				owed = c->last[i] & AQM_OWED_HINT;
				c->last[i] = now & ~AQM_OWED_HINT;
			}
			child += i;
		}
	}
	if (f == &nf)
		bpf_map_update_elem(&share_flows, &fk, &nf, BPF_ANY);
	skb->priority = classid + child;
	if (c) {
		if (owed && aqm_enqueue(skb, c->class_ifindex, skb->priority & 0xffff, now))
			return 1;
		aqm_stamp(skb, c->class_ifindex, skb->priority, now);
	}
	return 0;
}
