package addrbook

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Defaults of Options.
const (
	DefaultReclaimAfter  = 30 * time.Second
	DefaultSweepInterval = 30 * time.Second
)

// Holder is who holds an address: a share of a claim on a node.
type Holder struct {
	Node           string
	Share          string
	ClaimNamespace string
	ClaimName      string
	ClaimUID       types.UID
}

func (h Holder) identity() string { return h.Node + "/" + h.Share }

// Options configure a Book.
type Options struct {
	Client kubernetes.Interface
	// Namespace holds the records: the agent's own.
	Namespace string
	// Node is the agent's node.
	Node string
	// ReclaimAfter is how long a node's Ready condition must have been
	// Unknown before its addresses are taken back (DefaultReclaimAfter).
	ReclaimAfter time.Duration
	// SweepInterval is how often Run looks for records whose holder is
	// gone (DefaultSweepInterval).
	SweepInterval time.Duration
	// Now is the clock (tests); time.Now by default.
	Now func() time.Time
}

// Book records the holders of cluster-wide pools' addresses (see the
// package doc).
type Book struct {
	o      Options
	sweeps atomic.Uint64 // Sweep's calls
	view   viewSlot      // the watched records, once Watch runs
}

// New returns a Book; it talks to the API server only when used.
func New(o Options) *Book {
	if o.ReclaimAfter <= 0 {
		o.ReclaimAfter = DefaultReclaimAfter
	}
	if o.SweepInterval <= 0 {
		o.SweepInterval = DefaultSweepInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Book{o: o}
}

// Hold records addr of pool as h's. It returns true where the address is
// now h's (or already was), false where a live holder has it.
func (b *Book) Hold(ctx context.Context, pool string, addr netip.Addr, h Holder) (bool, error) {
	leases := b.o.Client.CoordinationV1().Leases(b.o.Namespace)
	name := recordName(pool, addr)
	rec := b.record(pool, addr, h, name)
	_, err := leases.Create(ctx, rec, metav1.CreateOptions{})
	if err == nil {
		return true, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return false, fmt.Errorf("record address %s of pool %s: %w", addr, pool, err)
	}
	cur, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		// Released between the two calls: the next prepare's try
		// takes it; this one moves on.
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the record of address %s of pool %s: %w", addr, pool, err)
	}
	if holderOf(cur) == h.identity() {
		return true, nil
	}
	gone, why, err := b.holderGone(ctx, cur, true, map[string]nodeVerdict{})
	if err != nil || !gone {
		return false, err
	}
	// Taken over with the resourceVersion read: of two agents taking the
	// same stale record, one gets a conflict.
	rec.ResourceVersion = cur.ResourceVersion
	if _, err := leases.Update(ctx, rec, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("take over address %s of pool %s: %w", addr, pool, err)
	}
	klog.FromContext(ctx).Info("Took over a pool address whose holder is gone", "pool", pool, "address", addr, "formerHolder", holderOf(cur), "why", why)
	return true, nil
}

// Release deletes the record of addr of pool where share on this node
// holds it; a record of another holder, or none, is left as it is.
func (b *Book) Release(ctx context.Context, pool string, addr netip.Addr, share string) error {
	leases := b.o.Client.CoordinationV1().Leases(b.o.Namespace)
	name := recordName(pool, addr)
	cur, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the record of address %s of pool %s: %w", addr, pool, err)
	}
	if holderOf(cur) != b.o.Node+"/"+share {
		return nil
	}
	return b.deleteRecord(ctx, cur)
}

// Node is the book's node, as holders on it are named.
func (b *Book) Node() string { return b.o.Node }

func (b *Book) record(pool string, addr netip.Addr, h Holder, name string) *coordv1.Lease {
	id := h.identity()
	now := metav1.NewMicroTime(b.o.Now())
	return &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: b.o.Namespace,
			Labels:    map[string]string{poolLabel: poolHash(pool), "app.kubernetes.io/managed-by": "carve"},
			Annotations: map[string]string{
				poolAnnotation: pool, addressAnnotation: addr.String(),
				claimNamespaceAnnotation: h.ClaimNamespace, claimNameAnnotation: h.ClaimName, claimUIDAnnotation: string(h.ClaimUID),
			},
		},
		Spec: coordv1.LeaseSpec{HolderIdentity: &id, AcquireTime: &now},
	}
}

func (b *Book) deleteRecord(ctx context.Context, cur *coordv1.Lease) error {
	uid, rv := cur.UID, cur.ResourceVersion
	err := b.o.Client.CoordinationV1().Leases(b.o.Namespace).Delete(ctx, cur.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Gone already, or changed hands since it was read: not ours
		// to delete any more.
		return nil
	}
	return fmt.Errorf("delete the record %s: %w", cur.Name, err)
}

func holderOf(l *coordv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// nodeOf is the node part of a holder identity.
func nodeOf(identity string) string {
	n, _, _ := strings.Cut(identity, "/")
	return n
}
