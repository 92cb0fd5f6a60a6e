// Package shareplugin is what carve's score plugins, ShareFit and Topology,
// have in common: Base, which each embeds, holds the driver they follow, the
// SharedDRAManager and the ledger, and runs the extension points that go the
// same way in both, PreScore and Score included, with the plugin's own part
// of those two in Scoring; DriverArgs and DecodeArgs are their args'
// common field and decoding; Setup is the common half of their factories.
package shareplugin

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/carve-dra/carve/scheduler/pkg/estimate"
)

// Base is embedded by each of carve's score plugins. Its methods are the
// plugins' Name, SignPod, EventsToRegister, PreFilter, PreFilterExtensions,
// PreScore, Score and ScoreExtensions.
type Base struct {
	// Plugin is the plugin's name in a scheduler profile.
	Plugin string
	// Driver is the DRA driver whose devices the plugin follows (the
	// args' driverName).
	Driver  string
	DRA     fwk.SharedDRAManager
	Ledger  *estimate.Ledger
	Scoring Scoring
}

// Plugin is what Base makes each of carve's score plugins; each asserts it
// (var _ shareplugin.Plugin = (*X)(nil)), so that one list names the
// interfaces they share.
type Plugin interface {
	fwk.EnqueueExtensions
	fwk.PreFilterPlugin
	fwk.PreScorePlugin
	fwk.ScorePlugin
	fwk.SignPlugin
}

var _ Plugin = (*Base)(nil)

// Scoring is a plugin's own part of PreScore and Score.
type Scoring struct {
	// MinClaims is the fewest claims of a pod that is scored: PreScore
	// skips pods with fewer (at least 1) before any estimate.
	MinClaims int
	// Scores is whether the pod with estimate e is scored at all: PreScore
	// skips it otherwise.
	Scores func(e *estimate.Estimate) bool
	// Score is a node's score from the devices the pod's estimate picks
	// there; ok is false where the estimate finds no room.
	Score func(picks []estimate.Pick, ok bool) int64
}

// Setup is the first half of a plugin factory: it decodes the args of the
// plugin named name (see DecodeArgs) and builds its Base, with the ledger fed
// by the handle's claim informer (one for all plugins of the driver). It logs
// "<name> configured" with logged(args) (nil: nothing), then the driver.
func Setup[A any, P interface {
	*A
	Args
}](ctx context.Context, obj runtime.Object, h fwk.Handle, name string, logged func(A) []any) (A, Base, error) {
	args, err := DecodeArgs[A, P](name, obj)
	if err != nil {
		return args, Base{}, err
	}
	driver := P(&args).Driver()
	logger := klog.FromContext(ctx)
	ledger, err := estimate.LedgerFor(logger, h.SharedInformerFactory(), driver)
	if err != nil {
		return args, Base{}, fmt.Errorf("%s: claim informer: %w", name, err)
	}
	var kv []any
	if logged != nil {
		kv = logged(args)
	}
	logger.V(2).Info(name+" configured", append(kv, "driver", driver)...)
	return args, Base{Plugin: name, Driver: driver, DRA: h.SharedDRAManager(), Ledger: ledger}, nil
}

// Name implements fwk.Plugin.
func (b *Base) Name() string { return b.Plugin }

// SignPod keeps pods with claims out of batching, as DynamicResources does:
// their scores depend on allocations made since the last pod.
func (b *Base) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if len(pod.Spec.ResourceClaims) > 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pods with resource claims are not signable")
	}
	return nil, nil
}

// EventsToRegister implements fwk.EnqueueExtensions: carve's score plugins
// never reject a pod, so no cluster event can make one schedulable. Without
// it the framework assumes a PreFilter or Reserve plugin cares about every
// event, and requeues unschedulable pods on each (measured: 2% of the
// scheduler's CPU in the benchmark, in the queue alone).
func (b *Base) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return nil, nil
}

// PreFilter marks the ledger as DynamicResources' allocator sees it in
// this cycle (see estimate.MarkCycle); it never rejects a pod.
func (b *Base) PreFilter(_ context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if len(pod.Spec.ResourceClaims) == 0 || b.DRA == nil {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	estimate.MarkCycle(state, b.DRA, b.Ledger, b.Driver)
	return nil, nil
}

// PreFilterExtensions implements fwk.PreFilterPlugin: there is no per-node
// state to update.
func (b *Base) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// Estimate is the pod's estimate for this cycle (see estimate.ForCycle).
func (b *Base) Estimate(ctx context.Context, state fwk.CycleState, pod *v1.Pod) (*estimate.Estimate, error) {
	return estimate.ForCycle(ctx, state, b.DRA, b.Ledger, pod, b.Driver)
}

// PreScore computes the pod's estimate once, and skips Score for the pods
// Scoring does not score.
func (b *Base) PreScore(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if len(pod.Spec.ResourceClaims) < max(b.Scoring.MinClaims, 1) || b.DRA == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	e, err := b.Estimate(ctx, state, pod)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if e == nil || !b.Scoring.Scores(e) {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score is Scoring's score of the devices the pod's estimate picks on the
// node.
func (b *Base) Score(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	e, err := b.Estimate(ctx, state, pod)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	node := nodeInfo.Node().Name
	picks, ok := e.Picks(node)
	score := b.Scoring.Score(picks, ok)
	klog.FromContext(ctx).V(6).Info(b.Plugin+" score", "pod", klog.KObj(pod), "node", node, "score", score, "fits", ok)
	return score, nil
}

// ScoreExtensions implements fwk.ScorePlugin: scores are already 0..100.
func (b *Base) ScoreExtensions() fwk.ScoreExtensions { return nil }
