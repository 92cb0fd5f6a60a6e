// Package addrbook records in the API server which share holds each address
// of a cluster-wide address pool, so that a pool whose subnet lives on an L2
// segment several nodes share hands out each address once in the cluster.
//
// # The mechanism, and why
//
// Each held address is one coordination.k8s.io/v1 Lease in the agent's own
// namespace, named after the pool and the address (carve-<pool hash>-<address>):
// the API server creates an object of a name once, so of any number of
// agents preparing at once on any nodes exactly one creates it and the
// others get AlreadyExists and try the next address. This is what
// Whereabouts, the CNI IPAM macvlan users run for the same problem, does
// with its OverlappingRangeIPReservation objects. A record names its holder:
// the node and the share (spec.holderIdentity <node>/<share key>) and the
// ResourceClaim (annotations: namespace, name, UID). Records are changed only
// with the resourceVersion that was read (optimistic concurrency), and
// deleted only with UID and resourceVersion preconditions, so an agent never
// removes a record another agent has just taken over.
//
// What other nodes hold is read, before a share tries its candidates, from
// a view of the records a watch keeps (Watch; the agent runs it where it has
// a cluster-wide pool): a List per prepare made a burst of shares ask the
// API server for every record at once. The view only steers the choice;
// the Create decides, and a share that finds the pool exhausted by the view
// lists the records before it gives up.
//
// Per-node ranges derived without coordination were the other choice: they
// need a node index no two nodes share, which nothing in Kubernetes gives
// without a writer of its own, and they strand addresses on idle nodes.
//
// # When an address is free again
//
//   - its claim is unprepared: the agent deletes the record (netdev's
//     Unprepare; an unprepare that cannot reach the API server fails, and the
//     kubelet retries it);
//   - its ResourceClaim is gone (deleted, or another object of that name):
//     its node's agent's next sweep (Run, every SweepInterval) deletes the
//     record, or, where that agent is down, another agent's within
//     othersClaimsEvery sweeps (about 5 minutes): each agent reads its own
//     records' claims, so that the API server is not asked for every
//     record's claim by every node;
//   - its node is gone: the Node is deleted, carries the
//     node.kubernetes.io/out-of-service taint, or its Ready condition has
//     been Unknown (the node lifecycle controller's mark of a kubelet that
//     stopped reporting) for ReclaimAfter. A killed node's addresses are
//     therefore free within node-monitor-grace-period plus ReclaimAfter
//     plus SweepInterval (with a tenth of jitter) of its death: 40, 30 and
//     33 s with the defaults, 20, 30 and 33 s on the local multi-node
//     cluster. An agent that tries to take one of them does not wait for
//     the sweep: Hold judges the holder as the sweep does.
//
// A node cut off from the API server but still running its pods looks the
// same as a dead one after those bounds: its addresses may then be handed
// out again. Where a partition must never reuse addresses, use a pool of
// scope Node per node (node-local subnets), or taint nodes out-of-service by
// hand only (set ReclaimAfter very long).
package addrbook
