package estimate

import (
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
)

// Ledger keeps, per device of one driver, the capacity its shares consume,
// by claim, updated as claims change rather than gathered for every pod.
//
// The tracker's GatherAllocatedState copies every allocated device and walks
// every in-flight allocation; measured in the scheduler, calling it once
// more per pod cost as much as DynamicResources' own call (about a tenth of
// the scheduler's CPU). The ledger is fed by the ResourceClaim informer and,
// for allocations still in flight, by the plugins' Reserve and Unreserve
// (Record, Forget), so that the next pod already sees the last one's shares.
type Ledger struct {
	driver string
	mu     sync.RWMutex
	claims map[types.UID][]share
	used   map[structured.DeviceID]map[resourceapi.QualifiedName]int64
}

// share is what one claim consumes of one device.
type share struct {
	id       structured.DeviceID
	consumed map[resourceapi.QualifiedName]int64
}

// NewLedger is an empty ledger for driver.
func NewLedger(driver string) *Ledger {
	return &Ledger{driver: driver, claims: map[types.UID][]share{}, used: map[structured.DeviceID]map[resourceapi.QualifiedName]int64{}}
}

var (
	ledgersMu sync.Mutex
	ledgers   = map[ledgerKey]*Ledger{}
)

type ledgerKey struct {
	factory informers.SharedInformerFactory
	driver  string
}

// LedgerFor is the ledger of driver fed by factory's ResourceClaim informer,
// one per factory and driver however many plugins ask. A nil factory gives a
// ledger fed only by Record and Forget.
func LedgerFor(logger klog.Logger, factory informers.SharedInformerFactory, driver string) (*Ledger, error) {
	if factory == nil {
		return NewLedger(driver), nil
	}
	ledgersMu.Lock()
	defer ledgersMu.Unlock()
	k := ledgerKey{factory, driver}
	if l := ledgers[k]; l != nil {
		return l, nil
	}
	l := NewLedger(driver)
	_, err := factory.Resource().V1().ResourceClaims().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { l.observe(logger, obj) },
		UpdateFunc: func(_, obj any) { l.observe(logger, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if c, ok := obj.(*resourceapi.ResourceClaim); ok {
				l.Forget(c.UID)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	ledgers[k] = l
	return l, nil
}

func (l *Ledger) observe(logger klog.Logger, obj any) {
	c, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		logger.V(4).Info("Ignoring unexpected object in the claim informer", "type", klog.Format(obj))
		return
	}
	l.Record(c)
}

// Record sets what claim consumes to its allocation: nothing when it has
// none.
func (l *Ledger) Record(claim *resourceapi.ResourceClaim) {
	var shares []share
	if a := claim.Status.Allocation; a != nil {
		for _, r := range a.Devices.Results {
			if r.Driver != l.driver || r.ShareID == nil || len(r.ConsumedCapacity) == 0 {
				continue
			}
			s := share{id: structured.MakeDeviceID(r.Driver, r.Pool, r.Device), consumed: make(map[resourceapi.QualifiedName]int64, len(r.ConsumedCapacity))}
			for n, q := range r.ConsumedCapacity {
				s.consumed[n] = q.Value()
			}
			shares = append(shares, s)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.apply(l.claims[claim.UID], -1)
	if len(shares) == 0 {
		delete(l.claims, claim.UID)
		return
	}
	l.claims[claim.UID] = shares
	l.apply(shares, 1)
}

// Forget drops what the claim consumes.
func (l *Ledger) Forget(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.apply(l.claims[uid], -1)
	delete(l.claims, uid)
}

func (l *Ledger) apply(shares []share, sign int64) {
	for _, s := range shares {
		m := l.used[s.id]
		if m == nil {
			m = map[resourceapi.QualifiedName]int64{}
			l.used[s.id] = m
		}
		for n, v := range s.consumed {
			m[n] += sign * v
		}
		empty := true
		for _, v := range m {
			if v != 0 {
				empty = false
			}
		}
		if empty {
			delete(l.used, s.id)
		}
	}
}

// Used is how much of capacity name the shares of device id consume.
func (l *Ledger) Used(id structured.DeviceID, name resourceapi.QualifiedName) int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.used[id][name]
}
