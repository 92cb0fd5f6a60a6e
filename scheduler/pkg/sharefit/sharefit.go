// Package sharefit is the ShareFit score plugin: for a pod whose claims ask
// for consumable capacity on carve devices, it scores each node by how full
// the devices the pod would get there would be. MostAllocated packs shares
// onto few devices; LeastAllocated spreads them.
package sharefit

import (
	"context"
	"math"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/carve-dra/carve/scheduler/pkg/estimate"
	"github.com/carve-dra/carve/scheduler/pkg/shareplugin"
)

// Name is the plugin's name in a scheduler profile.
const Name = "ShareFit"

// ShareFit scores nodes by the predicted fill of a pod's share devices. The
// embedded Base runs its extension points but Reserve and Unreserve.
type ShareFit struct {
	shareplugin.Base
}

// ShareFit is a shareplugin.Plugin (EnqueueExtensions, PreFilterPlugin,
// PreScorePlugin, ScorePlugin, SignPlugin) and a ReservePlugin.
var (
	_ shareplugin.Plugin = (*ShareFit)(nil)
	_ fwk.ReservePlugin  = (*ShareFit)(nil)
)

// New is the plugin factory for app.WithPlugin.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, base, err := shareplugin.Setup[Args](ctx, obj, h, Name, func(a Args) []any { return []any{"strategy", a.Strategy} })
	if err != nil {
		return nil, err
	}
	return newShareFit(base, args.Strategy), nil
}

// newShareFit is ShareFit over base, scoring under strategy.
func newShareFit(base shareplugin.Base, strategy Strategy) *ShareFit {
	base.Scoring = scoring(strategy)
	return &ShareFit{Base: base}
}

// scoring scores pods with share requests for the driver by the mean
// predicted fill of their share devices on the node, from 0 to 100
// (inverted for LeastAllocated). A node where the estimate finds no room
// scores 0.
func scoring(strategy Strategy) shareplugin.Scoring {
	return shareplugin.Scoring{
		Scores: func(e *estimate.Estimate) bool { return e.Shares > 0 },
		Score:  func(picks []estimate.Pick, ok bool) int64 { return Score(picks, ok, strategy) },
	}
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
	if len(pod.Spec.ResourceClaims) == 0 || s.DRA == nil {
		return nil
	}
	e, err := s.Estimate(ctx, state, pod)
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
		alloc := s.DRA.ResourceClaims().GetPendingAllocation(c.UID)
		if alloc == nil {
			logger.V(4).Info("ShareFit: no pending allocation at Reserve", "claim", klog.KObj(c))
			continue
		}
		if logger.V(3).Enabled() {
			for _, m := range estimate.Compare(picks, c, alloc, s.Driver) {
				logger.V(3).Info("ShareFit: the allocator chose other devices than the estimate", "pod", klog.KObj(pod), "node", node, "claim", m.Claim, "request", m.Request, "predicted", m.Predicted, "allocated", m.Actual)
			}
		}
		s.Ledger.Hold(c, alloc)
	}
	return nil
}

// Unreserve drops what Reserve recorded; what the informer shows of the
// claims stays.
func (s *ShareFit) Unreserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ string) {
	if len(pod.Spec.ResourceClaims) == 0 || s.DRA == nil {
		return
	}
	e, err := s.Estimate(ctx, state, pod)
	if err != nil || e == nil {
		return
	}
	for _, c := range e.Pending {
		s.Ledger.Release(c.UID)
	}
}
