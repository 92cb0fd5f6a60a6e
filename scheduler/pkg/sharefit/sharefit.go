// Package sharefit is the ShareFit score plugin: for a pod whose claims ask
// for consumable capacity on carve devices, it scores each node by how full
// the devices the pod would get there would be. MostAllocated packs shares
// onto few devices; LeastAllocated spreads them.
package sharefit

import (
	"context"
	"fmt"
	"math"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/carve-dra/carve/scheduler/pkg/estimate"
)

// Name is the plugin's name in a scheduler profile.
const Name = "ShareFit"

// ShareFit scores nodes by the predicted fill of a pod's share devices.
type ShareFit struct {
	args   Args
	dra    fwk.SharedDRAManager
	ledger *estimate.Ledger
}

var (
	_ fwk.EnqueueExtensions = (*ShareFit)(nil)
	_ fwk.PreFilterPlugin   = (*ShareFit)(nil)
	_ fwk.PreScorePlugin    = (*ShareFit)(nil)
	_ fwk.ScorePlugin       = (*ShareFit)(nil)
	_ fwk.ReservePlugin     = (*ShareFit)(nil)
	_ fwk.SignPlugin        = (*ShareFit)(nil)
)

// New is the plugin factory for app.WithPlugin.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := DecodeArgs(obj)
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	ledger, err := estimate.LedgerFor(logger, h.SharedInformerFactory(), args.DriverName)
	if err != nil {
		return nil, fmt.Errorf("%s: claim informer: %w", Name, err)
	}
	logger.V(2).Info("ShareFit configured", "strategy", args.Strategy, "driver", args.DriverName)
	return &ShareFit{args: args, dra: h.SharedDRAManager(), ledger: ledger}, nil
}

// Name implements fwk.Plugin.
func (s *ShareFit) Name() string { return Name }

// SignPod keeps pods with claims out of batching, as DynamicResources does:
// their scores depend on allocations made since the last pod.
func (s *ShareFit) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if len(pod.Spec.ResourceClaims) > 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pods with resource claims are not signable")
	}
	return nil, nil
}

// PreFilter marks the ledger as DynamicResources' allocator sees it in
// this cycle (see estimate.MarkCycle); it never rejects a pod.
func (s *ShareFit) PreFilter(_ context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if len(pod.Spec.ResourceClaims) == 0 || s.dra == nil {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	estimate.MarkCycle(state, s.dra, s.ledger, s.args.DriverName)
	return nil, nil
}

// EventsToRegister implements fwk.EnqueueExtensions: ShareFit never rejects a
// pod, so no cluster event can make one schedulable. Without it the
// framework assumes a PreFilter or Reserve plugin cares about every event,
// and requeues unschedulable pods on each (measured: 2% of the scheduler's
// CPU in the benchmark, in the queue alone).
func (s *ShareFit) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return nil, nil
}

// PreFilterExtensions implements fwk.PreFilterPlugin: there is no per-node
// state to update.
func (s *ShareFit) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// PreScore computes the pod's estimate once, and skips Score for pods
// without share requests for the driver.
func (s *ShareFit) PreScore(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if len(pod.Spec.ResourceClaims) == 0 || s.dra == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	e, err := estimate.ForCycle(ctx, state, s.dra, s.ledger, pod, s.args.DriverName)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if e == nil || e.Shares == 0 {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score is the mean predicted fill of the pod's share devices on the node,
// from 0 to 100 (inverted for LeastAllocated). A node where the estimate
// finds no room scores 0.
func (s *ShareFit) Score(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	e, err := estimate.ForCycle(ctx, state, s.dra, s.ledger, pod, s.args.DriverName)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	node := nodeInfo.Node().Name
	picks, ok := e.Picks(node)
	score := Score(picks, ok, s.args.Strategy)
	klog.FromContext(ctx).V(6).Info("ShareFit score", "pod", klog.KObj(pod), "node", node, "score", score, "fits", ok)
	return score, nil
}

// Score turns picks into a node score under strategy: the mean fill of the
// devices the pod's shares get (whole devices do not count).
func Score(picks []estimate.Pick, ok bool, strategy Strategy) int64 {
	var sum float64
	n := 0
	for _, p := range picks {
		if p.Request.Share() {
			sum += p.Utilization
			n++
		}
	}
	if !ok || n == 0 {
		return fwk.MinScore
	}
	fill := sum / float64(n)
	if strategy == LeastAllocated {
		fill = 1 - fill
	}
	return int64(math.Round(fill * float64(fwk.MaxScore)))
}

// Reserve records in the ledger the shares DynamicResources (which reserves
// before carve's plugins) allocated the pod, so that the next pod's estimate
// sees them before the claims' informer does.
func (s *ShareFit) Reserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, node string) *fwk.Status {
	if len(pod.Spec.ResourceClaims) == 0 || s.dra == nil {
		return nil
	}
	e, err := estimate.ForCycle(ctx, state, s.dra, s.ledger, pod, s.args.DriverName)
	if err != nil || e == nil {
		// Only the estimate of later pods suffers; the informer catches up.
		klog.FromContext(ctx).V(4).Info("ShareFit: no shares to record", "pod", klog.KObj(pod), "err", err)
		return nil
	}
	logger := klog.FromContext(ctx)
	// What the scores assumed, before this pod's shares are in the ledger.
	picks, _ := e.Picks(node)
	for _, c := range e.Pending {
		// The allocation is in flight (the claim's status is written in
		// PreBind): the tracker has it, the informer does not yet.
		alloc := s.dra.ResourceClaims().GetPendingAllocation(c.UID)
		if alloc == nil {
			logger.V(4).Info("ShareFit: no pending allocation at Reserve", "claim", klog.KObj(c))
			continue
		}
		if logger.V(3).Enabled() {
			for _, m := range estimate.Compare(picks, c, alloc, s.args.DriverName) {
				logger.V(3).Info("ShareFit: the allocator chose other devices than the estimate", "pod", klog.KObj(pod), "node", node, "claim", m.Claim, "request", m.Request, "predicted", m.Predicted, "allocated", m.Actual)
			}
		}
		s.ledger.Hold(c, alloc)
	}
	return nil
}

// Unreserve drops what Reserve recorded; what the informer shows of the
// claims stays.
func (s *ShareFit) Unreserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ string) {
	if len(pod.Spec.ResourceClaims) == 0 || s.dra == nil {
		return
	}
	e, err := estimate.ForCycle(ctx, state, s.dra, s.ledger, pod, s.args.DriverName)
	if err != nil || e == nil {
		return
	}
	for _, c := range e.Pending {
		s.ledger.Release(c.UID)
	}
}

// ScoreExtensions implements fwk.ScorePlugin: scores are already 0..100.
func (s *ShareFit) ScoreExtensions() fwk.ScoreExtensions { return nil }
