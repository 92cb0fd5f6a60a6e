package netdev

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare/checkpoint"
	"github.com/carve-dra/carve/prepare/hook"
)

// The reaper removes the kernel objects of unprepared shares off the
// kubelet's path. Unprepare releases a share at once (its classifier
// entries go, so its traffic is no longer charged or shaped, and its
// addresses go back to the pool) and queues the rest: the HTB classes, the
// parent's egress shaper and IFB once idle, the share's interface if it is still on
// the node, and the attach spec. Removing those waits for RCU grace periods
// under RTNL, tens of milliseconds each; the reaper takes them in batches,
// one parent lock per parent and one grace period for all the batch's
// interfaces.
//
// The queue is on disk (a checkpoint of its own, of this boot), written
// before Unprepare returns: an agent that crashes resumes it at start. A
// queued share keeps its class minors reserved and its names taken until it
// is reaped, and a prepare of the same share first reaps it, so that
// nothing prepared collides with what is being removed.

// reapItem is what is left to remove of one unprepared share.
type reapItem struct {
	Key          string `json:"key"`
	Parent       string `json:"parent,omitempty"`
	Link         string `json:"link"`
	EgressMinor  uint16 `json:"egressMinor,omitempty"`
	IngressMinor uint16 `json:"ingressMinor,omitempty"`
	// FlowClasses: the share's classes have flow children (flows.go).
	FlowClasses bool `json:"flowClasses,omitempty"`
	// EgressRate and IngressRate are the share's class rates, bits/s,
	// kept while its classes are parked (park.go); an item without them
	// (an older carve's) has its classes deleted.
	EgressRate  uint64 `json:"egressRate,omitempty"`
	IngressRate uint64 `json:"ingressRate,omitempty"`
	// CheckIdle: the share's classes were retired at unprepare (park.go);
	// the reaper has only to see whether the parent's shaper and IFB
	// are idle.
	CheckIdle bool `json:"checkIdle,omitempty"`
}

// merge fills what it does not know from an older item of the same share.
func (it reapItem) merge(old reapItem) reapItem {
	if old.Key != it.Key {
		return it
	}
	it.Parent = cmp.Or(it.Parent, old.Parent)
	it.EgressMinor = cmp.Or(it.EgressMinor, old.EgressMinor)
	it.IngressMinor = cmp.Or(it.IngressMinor, old.IngressMinor)
	it.FlowClasses = it.FlowClasses || old.FlowClasses
	it.EgressRate = cmp.Or(it.EgressRate, old.EgressRate)
	it.IngressRate = cmp.Or(it.IngressRate, old.IngressRate)
	it.CheckIdle = it.CheckIdle || old.CheckIdle
	return it
}

// reapingSuffix marks the attach spec of a share being reaped: no longer
// read as a share's (its addresses are free), removed with the rest.
const reapingSuffix = ".reaping"

// reapGroup is the interface group the reaper puts a batch's interfaces in,
// to delete them with one request (one RCU grace period for all). Only the
// reaper sets it, only on share interfaces it is removing.
const reapGroup = 0xca7e

// reapGather is how long the reaper lets a batch gather before it starts.
const reapGather = 100 * time.Millisecond

// reapYieldMax bounds how long the reaper stays out of prepares' way.
const reapYieldMax = time.Second

// reapRetry is how long a failed item waits before it is tried again.
const reapRetry = time.Second

type reaper struct {
	p     *NICPreparer
	queue *checkpoint.Checkpoint[reapItem]

	mu      sync.Mutex
	pending map[string]reapItem
	// inflight holds the keys of the batch being reaped, each with the
	// batch's done channel.
	inflight map[string]chan struct{}
	running  bool
	retrying int
	idle     *sync.Cond
}

func newReaper(p *NICPreparer) (*reaper, error) {
	q, err := checkpoint.Open[reapItem](filepath.Join(p.opts.StateDir, "netdev", "reaper"), p.opts.BootID, nil)
	if err != nil {
		return nil, fmt.Errorf("the reaper's queue: %w", err)
	}
	r := &reaper{p: p, queue: q, pending: map[string]reapItem{}, inflight: map[string]chan struct{}{}}
	r.idle = sync.NewCond(&r.mu)
	return r, nil
}

// enqueue records the item on disk, then hands it to the worker.
func (r *reaper) enqueue(it reapItem) error {
	if err := r.queue.Update(func(items *checkpoint.Records[reapItem]) error {
		// A second unprepare of the share (a retry, without its
		// record) knows less than the first: what is queued stays.
		old, _ := items.Get(types.UID(it.Key))
		it = it.merge(old)
		items.Set(types.UID(it.Key), it)
		return nil
	}); err != nil {
		return fmt.Errorf("queue the removal of share %s: %w", it.Link, err)
	}
	r.add(it)
	return nil
}

func (r *reaper) add(it reapItem) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending[it.Key] = it.merge(r.pending[it.Key])
	if !r.running {
		r.running = true
		// The batch gathers for a moment: pods deleted together (a
		// Job, a rollout) are reaped together, under one RTNL hold
		// and grace period, instead of taking RTNL from the prepares
		// that follow once per share.
		time.AfterFunc(reapGather, r.run)
	}
}

// resume queues what the disk holds (at start).
func (r *reaper) resume() ([]reapItem, error) {
	items, err := r.queue.Read()
	if err != nil {
		return nil, err
	}
	var out []reapItem
	for _, it := range items {
		it = it.sanitized()
		out = append(out, it)
		r.add(it)
	}
	return out, nil
}

// sanitized is the item with only what carve itself would have queued: the
// queue is root's, but a reaper that deletes links, classes and files by the
// names it reads would follow a planted or damaged entry anywhere. The link
// (and with it the attach spec's path) is derived from the key, as prepare
// names it; a parent that is no interface name, or a minor outside the
// share classes' range, is dropped: nothing is removed by it, and a class it
// named goes with its parent's shaper once that shaper holds no share.
func (it reapItem) sanitized() reapItem {
	it.Link = LinkName(it.Key)
	if !validLinkName(it.Parent) {
		it.Parent = ""
	}
	for _, m := range []*uint16{&it.EgressMinor, &it.IngressMinor} {
		if *m < minMinor || *m >= maxMinor {
			*m = 0
		}
	}
	return it
}

// validLinkName is an interface name the kernel would accept (1 to 15 bytes,
// not "." or "..", no '/', ':', white space or NUL).
func validLinkName(name string) bool {
	if name == "" || len(name) > 15 || name == "." || name == ".." {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c == '/' || c == ':' || c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// run reaps batches until nothing is pending.
func (r *reaper) run() {
	for {
		r.mu.Lock()
		if len(r.pending) == 0 {
			r.running = false
			r.idle.Broadcast()
			r.mu.Unlock()
			return
		}
		batch := make([]reapItem, 0, len(r.pending))
		done := make(chan struct{})
		for k, it := range r.pending {
			batch = append(batch, it)
			r.inflight[k] = done
		}
		clear(r.pending)
		r.mu.Unlock()

		failed := r.reap(batch)

		r.mu.Lock()
		for _, it := range batch {
			delete(r.inflight, it.Key)
		}
		close(done)
		for _, it := range failed {
			r.retrying++
			time.AfterFunc(reapRetry, func() {
				r.mu.Lock()
				r.retrying--
				r.mu.Unlock()
				r.add(it)
			})
		}
		more := len(r.pending) > 0
		r.mu.Unlock()
		if more {
			time.Sleep(reapGather) // the next batch gathers too
		}
	}
}

// settle reaps key's item now, if one is queued or being reaped, so that a
// prepare of the same share finds its names free.
func (r *reaper) settle(key string) error {
	for {
		r.mu.Lock()
		if done, ok := r.inflight[key]; ok {
			r.mu.Unlock()
			<-done
			continue
		}
		it, ok := r.pending[key]
		if !ok {
			r.mu.Unlock()
			return nil
		}
		delete(r.pending, key)
		done := make(chan struct{})
		r.inflight[key] = done
		r.mu.Unlock()
		failed := r.reap([]reapItem{it})
		r.mu.Lock()
		delete(r.inflight, key)
		close(done)
		if len(failed) > 0 {
			r.pending[key] = it
		}
		r.mu.Unlock()
		if len(failed) > 0 {
			return fmt.Errorf("share %s is still being removed", it.Link)
		}
		return nil
	}
}

// wait blocks until nothing is pending, in flight or waiting for a retry.
func (r *reaper) wait() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.running || len(r.pending) > 0 || r.retrying > 0 {
		r.idle.Wait()
	}
}

// reap removes what the items name and returns those that failed (kept on
// disk, to be tried again).
func (r *reaper) reap(items []reapItem) (failed []reapItem) {
	p := r.p
	logger := klog.FromContext(context.Background()).WithName("reaper")
	errs := make([]error, len(items))
	retired := make([][]retiredBlock, len(items))
	byParent := map[string][]int{}
	for i, it := range items {
		if it.Parent != "" && (it.EgressMinor != 0 || it.IngressMinor != 0 || it.CheckIdle) {
			byParent[it.Parent] = append(byParent[it.Parent], i)
		}
	}
	for name, idx := range byParent {
		parent, err := p.h.LinkByName(name)
		if err != nil {
			continue // the parent went, and its classes with it
		}
		perr := p.reapClasses(parent, items, idx, errs, retired)
		if perr != nil {
			for _, i := range idx {
				errs[i] = errors.Join(errs[i], perr)
			}
		}
	}
	// Deleting interfaces holds RTNL for a grace period: it waits, up
	// to a bound, for a moment with no prepare in flight, so that a pod
	// starting does not queue behind one that went.
	p.waitForNoPrepare(reapYieldMax)
	if err := p.deleteLinks(items, errs); err != nil {
		logger.Error(err, "Removing share interfaces")
	}
	// A classifier link pinned for a device whose namespace is gone (a
	// pod's interface) is dead weight.
	if p.opts.PinDir != "" {
		if _, err := bpf.CleanupDefunct(p.opts.PinDir); err != nil {
			logger.Error(err, "Removing defunct classifier links")
		}
		if err := p.removeStaleFilterGuards(klog.NewContext(context.Background(), logger)); err != nil {
			logger.Error(err, "Removing the pod guards of unprepared shares")
		}
	}
	var reaped []int
	for i, it := range items {
		if errs[i] == nil {
			for _, path := range []string{p.specPath(it.Link), p.specPath(it.Link) + reapingSuffix} {
				if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
					errs[i] = errors.Join(errs[i], err)
				}
			}
		}
		if errs[i] != nil {
			logger.Error(errs[i], "Removing an unprepared share; will retry", "link", it.Link, "parent", it.Parent)
			failed = append(failed, it)
			continue
		}
		reaped = append(reaped, i)
	}
	if err := r.queue.Update(func(q *checkpoint.Records[reapItem]) error {
		for _, i := range reaped {
			q.Delete(types.UID(items[i].Key))
		}
		return nil
	}); err != nil {
		// The blocks stay the items' until a restart resumes them:
		// handed on now, a crash could have them retired twice.
		logger.Error(err, "Recording reaped shares")
		return failed
	}
	// Only now, with the items off the disk, are their blocks another's.
	for _, i := range reaped {
		p.publishRetired(retired[i])
		p.freeMinors(items[i].Key)
	}
	logger.V(3).Info("Reaped shares", "count", len(reaped), "failed", len(failed))
	return failed
}

// reapClasses takes the items' classes off parent's egress shaper and its
// IFB (parked or deleted, park.go), then removes the shaper and IFB if no
// share is left on them, under the parent's lock.
// What each item retired goes in retired, by the item's index, to be
// handed on (publishRetired) once the queue records the items reaped.
func (p *NICPreparer) reapClasses(parent netlink.Link, items []reapItem, idx []int, errs []error, retired [][]retiredBlock) error {
	unlock, err := p.lockParent(parent)
	if err != nil {
		return err
	}
	defer unlock()
	ifb, ifbErr := p.h.LinkByName(ifbName(parent))
	// Whether an older carve's HTB is at the parent's root: asked once.
	rootHTB := false
	for _, i := range idx {
		if items[i].EgressMinor != 0 {
			rootHTB = p.parentRootIsHTB(parent)
			break
		}
	}
	var egress, ingress bool
	batch := make(map[string]bool, len(idx))
	for _, i := range idx {
		batch[items[i].Key] = true
		// Classes retired at unprepare already: only whether the
		// shaper and IFB are idle is left.
		egress = egress || items[i].CheckIdle
		ingress = ingress || items[i].CheckIdle
		if m := items[i].EgressMinor; m != 0 {
			egress = true
			rbs, err := p.retireEgressClass(parent, items[i].Key, m, items[i].FlowClasses, items[i].EgressRate, rootHTB)
			errs[i] = errors.Join(errs[i], err)
			retired[i] = append(retired[i], rbs...)
		}
		if m := items[i].IngressMinor; m != 0 && ifbErr == nil {
			ingress = true
			rb, err := p.retireBlock(ifb, items[i].Key, m, items[i].FlowClasses, items[i].IngressRate)
			if errs[i] = errors.Join(errs[i], err); err == nil {
				retired[i] = append(retired[i], rb)
			}
		}
	}
	// Where this agent's own shares still hold classes on a device, it
	// is not idle; only where none do is the kernel asked (another agent's
	// shares, in a rolling update, are known only there).
	var out []error
	if egress && !p.othersHoldClasses(egressShaperName(parent.Attrs().Index), batch) {
		out = append(out, p.removeEgressShaperIfIdle(parent))
	}
	if ingress && !p.othersHoldClasses(ifbName(parent), batch) {
		out = append(out, p.removeIngressIFBIfIdle(parent))
	}
	// Blocks parked on a device that went idle and was removed went
	// with it.
	for _, i := range idx {
		for j, rb := range retired[i] {
			if _, err := p.h.LinkByName(rb.device); err != nil {
				retired[i][j].parked = false
			}
		}
	}
	return errors.Join(out...)
}

// deleteLinks removes the items' interfaces still in the node's namespace:
// one that moved into a pod went with the pod's namespace, and is not paid
// for twice. They are deleted as one group, with one grace period.
func (p *NICPreparer) deleteLinks(items []reapItem, errs []error) error {
	var grouped []int
	for i, it := range items {
		link, err := p.h.LinkByName(it.Link)
		if err != nil {
			continue
		}
		if err := p.h.LinkSetGroup(link, reapGroup); err != nil {
			if err := p.h.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
				errs[i] = errors.Join(errs[i], fmt.Errorf("delete %s: %w", it.Link, err))
			}
			continue
		}
		grouped = append(grouped, i)
	}
	if len(grouped) == 0 {
		return nil
	}
	err := hook.InNetns(p.opts.HostNS, func() error { return deleteLinkGroup(reapGroup) })
	if err == nil {
		return nil
	}
	// A kernel without group deletion: one by one.
	for _, i := range grouped {
		if link, lerr := p.h.LinkByName(items[i].Link); lerr == nil {
			if derr := p.h.LinkDel(link); derr != nil && !errors.Is(derr, unix.ENODEV) {
				errs[i] = errors.Join(errs[i], fmt.Errorf("delete %s: %w", items[i].Link, derr))
			}
		}
	}
	return fmt.Errorf("delete interface group %#x: %w", reapGroup, err)
}

// waitForNoPrepare returns once no prepare is in flight, or after limit.
func (p *NICPreparer) waitForNoPrepare(limit time.Duration) {
	_ = wait.PollUntilContextTimeout(context.Background(), 2*time.Millisecond, limit, true, func(context.Context) (bool, error) {
		return p.preparing.Load() == 0, nil
	})
}

// removeStaleFilterGuards unpins the pod guards the hook attached as
// cls_bpf filters (bpf.PodHookFilter) whose share has no attach spec on the
// node: an agent that knew no such guards unprepared it (a rollback). A
// share's spec is written before its guard is pinned and removed after it
// is unpinned, and a filter's record exists only once the hook ran, so no
// share being prepared or served loses its guard. A TCX link's guard
// says itself when its interface is gone (bpf.CleanupDefunct).
func (p *NICPreparer) removeStaleFilterGuards(ctx context.Context) error {
	names, err := bpf.FilterGuardNames(p.opts.PinDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if !validLinkName(name) {
			continue
		}
		spec := p.specPath(name)
		if _, err := os.Stat(spec); err == nil {
			continue
		}
		if _, err := os.Stat(spec + reapingSuffix); err == nil {
			continue
		}
		if err := bpf.UnpinPodGuard(p.opts.PinDir, name); err != nil {
			errs = append(errs, err)
			continue
		}
		klog.FromContext(ctx).V(2).Info("Removed the pod guard of a share no longer prepared", "share", name)
	}
	return errors.Join(errs...)
}
