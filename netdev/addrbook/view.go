package addrbook

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// poolIndex indexes the view's records by their pool label (the pool's
// hash).
const poolIndex = "pool"

// view is the records of the Book's namespace as a watch keeps them.
type view struct {
	informer cache.SharedIndexInformer
}

// viewSlot holds a Book's view once Watch made it.
type viewSlot = atomic.Pointer[view]

// Watch keeps a view of the namespace's address records, fed by a watch,
// until ctx ends; Held reads it, once it has listed them, instead of
// listing the records itself. With a List per prepare, every share of a
// burst asked the API server for every record at once: 100 share pods at
// once on one node spent most of a prepare in those Lists (goroutine
// samples of the agent: 2.9 of about 7 prepares at a time in Held, 1.4 in
// Hold's Create). The view may lag the API server by a watch event: Hold's
// Create is what decides who holds an address, and a share that finds a
// pool exhausted by the view lists the records before it gives up
// (HeldNow).
func (b *Book) Watch(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(b.o.Client, 0, informers.WithNamespace(b.o.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = poolLabel }))
	inf := f.Coordination().V1().Leases().Informer()
	err := inf.AddIndexers(cache.Indexers{poolIndex: func(obj any) ([]string, error) {
		l, ok := obj.(*coordv1.Lease)
		if !ok {
			return nil, nil
		}
		return []string{l.Labels[poolLabel]}, nil
	}})
	if err != nil {
		return fmt.Errorf("index the address records by pool: %w", err)
	}
	f.Start(ctx.Done())
	b.view.Store(&view{informer: inf})
	return nil
}

// Held is the addresses of pool recorded as held, by holder identity
// (<node>/<share>), which the allocator uses to skip what other nodes hold
// before it tries to create a record: from the watched view where Watch
// runs and has listed the records, else from a List (HeldNow). cached
// says which.
func (b *Book) Held(ctx context.Context, pool string) (held map[netip.Addr]string, cached bool, err error) {
	v := b.view.Load()
	if v == nil || !v.informer.HasSynced() {
		held, err = b.HeldNow(ctx, pool)
		return held, false, err
	}
	objs, err := v.informer.GetIndexer().ByIndex(poolIndex, poolHash(pool))
	if err != nil {
		return nil, false, fmt.Errorf("the watched records of pool %s: %w", pool, err)
	}
	held = make(map[netip.Addr]string, len(objs))
	for _, o := range objs {
		if r, ok := o.(*coordv1.Lease); ok {
			addRecord(held, r, pool)
		}
	}
	return held, true, nil
}

// HeldNow is Held from a List of the pool's records: what the API server
// has now.
func (b *Book) HeldNow(ctx context.Context, pool string) (map[netip.Addr]string, error) {
	list, err := b.o.Client.CoordinationV1().Leases(b.o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: poolLabel + "=" + poolHash(pool)})
	if err != nil {
		return nil, fmt.Errorf("list the records of pool %s: %w", pool, err)
	}
	held := make(map[netip.Addr]string, len(list.Items))
	for i := range list.Items {
		addRecord(held, &list.Items[i], pool)
	}
	return held, nil
}

// addRecord adds r's address to held where r is a record of pool (a
// pool's hash names other pools' too, however unlikely).
func addRecord(held map[netip.Addr]string, r *coordv1.Lease, pool string) {
	if r.Annotations[poolAnnotation] != pool {
		return
	}
	if a, err := netip.ParseAddr(r.Annotations[addressAnnotation]); err == nil {
		held[a] = holderOf(r)
	}
}
