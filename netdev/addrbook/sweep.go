package addrbook

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// outOfService is the taint an admin puts on a node that is down for good
// (Kubernetes' non-graceful node shutdown): its addresses go at once.
const outOfService = "node.kubernetes.io/out-of-service"

// othersClaimsEvery is how often, in sweeps, an agent reads the claims of
// other nodes' records: each node's agent reads its own records' claims
// every sweep, so another's are read only for a node whose agent is down
// (about 5 minutes at the default interval). The API server is asked for
// each record's claim by one agent, not by every node's.
const othersClaimsEvery = 10

// nodeVerdict is what one sweep found of a holder's node.
type nodeVerdict struct {
	gone bool
	why  string
	err  error
}

// holderGone says whether the record's holder is gone, and why: its claim
// (deleted, or another object of the name), read where claims is set, or
// its node (see the package doc), read once a sweep (nodes). A record that
// names no claim is judged by its node alone.
func (b *Book) holderGone(ctx context.Context, rec *coordv1.Lease, claims bool, nodes map[string]nodeVerdict) (bool, string, error) {
	ns, name, uid := rec.Annotations[claimNamespaceAnnotation], rec.Annotations[claimNameAnnotation], rec.Annotations[claimUIDAnnotation]
	if name != "" && claims {
		c, err := b.o.Client.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, "its ResourceClaim is deleted", nil
		case err != nil:
			return false, "", fmt.Errorf("read claim %s/%s of record %s: %w", ns, name, rec.Name, err)
		case string(c.UID) != uid:
			return true, "its ResourceClaim was deleted and made again", nil
		}
	}
	node := nodeOf(holderOf(rec))
	if node == "" {
		return true, "it names no holder", nil
	}
	v, ok := nodes[node]
	if !ok {
		v.gone, v.why, v.err = b.nodeGone(ctx, node)
		nodes[node] = v
	}
	if v.err != nil {
		return false, "", fmt.Errorf("record %s: %w", rec.Name, v.err)
	}
	return v.gone, v.why, nil
}

// nodeGone says whether node is gone, and why (see the package doc).
func (b *Book) nodeGone(ctx context.Context, node string) (bool, string, error) {
	n, err := b.o.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, "its node is deleted", nil
	}
	if err != nil {
		return false, "", fmt.Errorf("read node %s: %w", node, err)
	}
	for _, t := range n.Spec.Taints {
		if t.Key == outOfService {
			return true, "its node is tainted " + outOfService, nil
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionUnknown && b.o.Now().Sub(c.LastTransitionTime.Time) >= b.o.ReclaimAfter {
			return true, fmt.Sprintf("its node's kubelet stopped reporting %s ago", b.o.Now().Sub(c.LastTransitionTime.Time).Round(time.Second)), nil
		}
	}
	return false, "", nil
}

// Sweep deletes every record in the namespace whose holder is gone, and
// returns how many it deleted. It reads each holder's node once, and the
// claims of this node's records, and every othersClaimsEvery sweeps (the
// first included) those of other nodes' records too.
func (b *Book) Sweep(ctx context.Context) (int, error) {
	others := b.sweeps.Add(1)%othersClaimsEvery == 1
	nodes := map[string]nodeVerdict{}
	list, err := b.o.Client.CoordinationV1().Leases(b.o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: poolLabel})
	if err != nil {
		return 0, fmt.Errorf("list the address records: %w", err)
	}
	logger := klog.FromContext(ctx)
	n := 0
	var firstErr error
	for i := range list.Items {
		rec := &list.Items[i]
		gone, why, err := b.holderGone(ctx, rec, others || nodeOf(holderOf(rec)) == b.o.Node, nodes)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if !gone {
			continue
		}
		if err := b.deleteRecord(ctx, rec); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		n++
		logger.Info("Freed a pool address whose holder is gone", "pool", rec.Annotations[poolAnnotation], "address", rec.Annotations[addressAnnotation],
			"holder", holderOf(rec), "why", why)
	}
	return n, firstErr
}

// Run sweeps every SweepInterval (with up to a tenth more, so that the
// agents of many nodes do not list at once) until ctx ends.
func (b *Book) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for {
		d := b.o.SweepInterval + time.Duration(rand.Int64N(int64(b.o.SweepInterval)/10+1)) //nolint:gosec // G404: jitter, no secret
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		if _, err := b.Sweep(ctx); err != nil {
			logger.Error(err, "Sweeping the pool address records")
		}
	}
}
