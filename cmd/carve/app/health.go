package app

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/fpga"
	"github.com/carve-dra/carve/prepare/health"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// sourcePresence is the Condition.Source of a device discovery no longer
// finds; sourceAFU of an FPGA's AFU changing under a claim.
const (
	sourcePresence = "presence"
	sourceAFU      = "fpga-afu"
)

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// deviceHealth ties the health sources to the tracker, and the tracker's
// decisions to the slices' taints, the kubelet's health stream, the pods'
// events, the metrics and the health file.
type deviceHealth struct {
	tracker    *health.Tracker
	cfg        nodeconfig.Health
	driverName string
	node       string
	stateDir   string
	nic        *netdev.NICHealth
	metrics    *health.Metrics
	// events records an event on a pod; nil records none.
	events func(pod corev1.ObjectReference, warning bool, reason, message string)
	client kubernetes.Interface
	// records reads the checkpoint: which claims hold a device.
	records func() (map[types.UID]prepare.ClaimRecord, error)

	mu sync.Mutex
	// ghosts are devices discovery no longer finds, published still
	// (tainted lost) while claims hold them or their hold-down runs.
	ghosts map[string]slices.Entry
	// last is what each device's status was at the last change handled,
	// by name; kinds the devices' kinds, ghosts' too.
	last  map[string]health.Status
	kinds map[string]string
}

func newDeviceHealth(cfg *nodeconfig.NodeConfig, node, stateDir, root string, reg *health.Metrics) *deviceHealth {
	hd, maxHD := cfg.Health.HoldDownOrDefault()
	return &deviceHealth{
		tracker: health.NewTracker(hd, maxHD, nil), cfg: cfg.Health, driverName: cfg.DriverName, node: node, stateDir: stateDir,
		nic:     &netdev.NICHealth{Root: root, ErrorsPerSecond: cfg.Health.ErrorRate(), ErrorsPerMillion: cfg.Health.ErrorPart()},
		metrics: reg, ghosts: map[string]slices.Entry{}, last: map[string]health.Status{}, kinds: map[string]string{},
	}
}

// rescanned observes what a rediscovery found: each NIC's link, and every
// device found before and not now (lost), or found again.
func (h *deviceHealth) rescanned(old, cur map[string]slices.Entry) {
	h.nic.Links(cur, h.tracker)
	h.mu.Lock()
	defer h.mu.Unlock()
	var held map[string][]prepare.ClaimRecord
	for name, e := range cur {
		h.kinds[name] = e.Kind
		if _, ok := h.ghosts[name]; ok {
			delete(h.ghosts, name)
			h.tracker.Observe(health.Condition{Device: name, Source: sourcePresence})
		}
		// An FPGA whose AFU changed under a claim: the claim's pods run
		// against a function they did not ask for.
		if o, ok := old[name]; ok && e.FPGA != nil && o.FPGA != nil && o.FPGA.AFUID != e.FPGA.AFUID {
			if held == nil {
				held = h.held()
			}
			if len(held[name]) > 0 {
				h.tracker.Observe(health.Condition{Device: name, Source: sourceAFU, Severity: health.Degraded, Reason: fpga.ReasonAFUChanged,
					Message: fmt.Sprintf("FPGA %s: AFU %s replaced by %s under %d claim(s)", e.FPGA.Address, orNone(o.FPGA.AFUID), orNone(e.FPGA.AFUID), len(held[name]))})
				h.tracker.Observe(health.Condition{Device: name, Source: sourceAFU})
			}
		}
	}
	for name, e := range old {
		if _, ok := cur[name]; ok {
			continue
		}
		h.ghosts[name] = e
		c := health.Condition{Device: name, Source: sourcePresence, Severity: health.Lost, Reason: "DeviceGone", Message: "discovery no longer finds it"}
		if e.NIC != nil {
			c = h.nic.Gone(name, *e.NIC)
			c.Source = sourcePresence
		}
		h.tracker.Observe(c)
	}
}

// held reports the devices prepared claims hold, by device name.
func (h *deviceHealth) held() map[string][]prepare.ClaimRecord {
	out := map[string][]prepare.ClaimRecord{}
	if h.records == nil {
		return out
	}
	recs, err := h.records()
	if err != nil {
		return out
	}
	for _, r := range recs {
		for _, d := range r.Devices {
			if d.Pool == h.node {
				out[d.Device] = append(out[d.Device], r)
			}
		}
	}
	return out
}

// dropGhosts forgets the ghosts no claim holds whose lost taint has been
// up for the hold-down: nothing left to tell.
func (h *deviceHealth) dropGhosts() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ghosts) == 0 {
		return
	}
	held := h.held()
	for name := range h.ghosts {
		s := h.tracker.Status(name)
		if len(held[name]) == 0 && time.Since(s.Since) >= s.HoldDown {
			delete(h.ghosts, name)
			h.tracker.Forget(name)
		}
	}
}

func (h *deviceHealth) effect(s health.Status) resourceapi.DeviceTaintEffect {
	return Effect(h.cfg, s)
}

// taint is the taint of a tainted device.
func (h *deviceHealth) taint(s health.Status) resourceapi.DeviceTaint {
	return Taint(h.driverName, h.cfg, s)
}

// Effect is the taint effect the node config gives a tainted device's
// severity and reason.
func Effect(cfg nodeconfig.Health, s health.Status) resourceapi.DeviceTaintEffect {
	sev := nodeconfig.SeverityDegraded
	if s.Severity == health.Lost {
		sev = nodeconfig.SeverityLost
	}
	return resourceapi.DeviceTaintEffect(cfg.Effect(sev, s.Reason))
}

// Taint is carve's taint on a tainted device: <driver>/unhealthy, its
// reason the value, the effect the node config's.
func Taint(driverName string, cfg nodeconfig.Health, s health.Status) resourceapi.DeviceTaint {
	// TimeAdded is kept to the second, as the API stores it, so the
	// published slice does not differ from the stored one.
	t := metav1.NewTime(s.Since.Truncate(time.Second))
	return resourceapi.DeviceTaint{Key: slices.TaintKey(driverName), Value: s.Reason, Effect: Effect(cfg, s), TimeAdded: &t}
}

// publishable is res with the taints and the ghosts.
func (h *deviceHealth) publishable(res resourceslice.DriverResources) resourceslice.DriverResources {
	taints := map[string][]resourceapi.DeviceTaint{}
	for name, s := range h.tracker.Snapshot() {
		if s.Tainted {
			taints[name] = []resourceapi.DeviceTaint{h.taint(s)}
		}
	}
	h.mu.Lock()
	ghosts := make([]resourceapi.Device, 0, len(h.ghosts))
	for _, e := range h.ghosts {
		ghosts = append(ghosts, e.Device)
	}
	h.mu.Unlock()
	return slices.WithTaints(res, taints, ghosts)
}

// message is what the kubelet shows in the pod's status.
func message(s health.Status) string {
	if !s.Tainted {
		return ""
	}
	m := s.Reason
	if s.Message != "" {
		m += ": " + s.Message
	}
	if s.Recovering {
		m += fmt.Sprintf(" (recovered; the taint clears at %s)", s.ClearAt.UTC().Format(time.RFC3339))
	}
	return m
}

// report is the kubelet's health report of every published device.
func (h *deviceHealth) report(devices map[string]slices.Entry) kubeletplugin.DeviceHealthReport {
	now := time.Now()
	rep := kubeletplugin.DeviceHealthReport{}
	add := func(name string) {
		s := h.tracker.Status(name)
		st := kubeletplugin.HealthStatusHealthy
		if s.Tainted {
			st = kubeletplugin.HealthStatusUnhealthy
		}
		rep.Devices = append(rep.Devices, kubeletplugin.DeviceHealth{PoolName: h.node, DeviceName: name, Health: st, LastUpdated: now, Message: message(s)})
	}
	for name := range devices {
		add(name)
	}
	h.mu.Lock()
	for name := range h.ghosts {
		if _, ok := devices[name]; !ok {
			add(name)
		}
	}
	h.mu.Unlock()
	sort.Slice(rep.Devices, func(i, j int) bool { return rep.Devices[i].DeviceName < rep.Devices[j].DeviceName })
	return rep
}

// changed handles a change of the tracker: metrics, events on the pods of
// the claims on each device whose taint changed, and the health file.
func (h *deviceHealth) changed(ctx context.Context) {
	logger := klog.FromContext(ctx)
	snap := h.tracker.Snapshot()
	h.mu.Lock()
	type change struct {
		before, after health.Status
		kind          string
	}
	var changes []change
	names := map[string]bool{}
	for n := range snap {
		names[n] = true
	}
	for n := range h.last {
		names[n] = true
	}
	file := map[string]health.FileEntry{}
	for n := range names {
		after, ok := snap[n]
		if !ok {
			after = health.Status{Device: n}
		}
		before := h.last[n]
		if ok {
			h.last[n] = after
		} else {
			delete(h.last, n)
		}
		kind := h.kinds[n]
		if after.Changes != before.Changes || after.Tainted != before.Tainted || after.Recovering != before.Recovering {
			changes = append(changes, change{before, after, kind})
		}
		if after.Tainted {
			t := h.taint(after)
			_, gone := h.ghosts[n]
			file[n] = health.FileEntry{Kind: kind, Severity: after.Severity.String(), Reason: after.Reason, Message: message(after),
				Taint: fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect), Since: after.Since, ClearAt: after.ClearAt,
				Flaps: after.Flaps, Changes: after.Changes, Gone: gone}
		}
	}
	h.mu.Unlock()
	if h.stateDir != "" {
		if err := health.WriteFile(h.stateDir, health.File{Updated: time.Now().UTC(), Devices: file}); err != nil {
			logger.Error(err, "Writing the health file")
		}
	}
	if len(changes) == 0 {
		return
	}
	held := h.held()
	for _, c := range changes {
		effect := ""
		if c.after.Tainted {
			effect = string(h.effect(c.after))
		}
		if h.metrics != nil {
			h.metrics.Set(c.kind, c.after, effect, c.after.Changes-c.before.Changes)
		}
		if c.after.Tainted == c.before.Tainted && c.after.Reason == c.before.Reason {
			continue // recovering or failing again within the hold-down
		}
		var reason, msg string
		warning := c.after.Tainted
		if warning {
			reason = "DeviceUnhealthy"
			msg = fmt.Sprintf("device %s/%s is %s: %s; tainted %s=%s:%s", h.node, c.after.Device, c.after.Severity, message(c.after),
				slices.TaintKey(h.driverName), c.after.Reason, effect)
		} else {
			reason = "DeviceHealthy"
			msg = fmt.Sprintf("device %s/%s is healthy again (%s held down %s); its taint is cleared", h.node, c.after.Device, c.before.Reason, c.before.HoldDown)
		}
		logger.Info("Device health changed", "device", c.after.Device, "kind", c.kind, "tainted", c.after.Tainted, "reason", c.after.Reason, "effect", effect, "flaps", c.after.Flaps)
		for _, r := range held[c.after.Device] {
			go h.podEvents(ctx, r, warning, reason, msg)
		}
	}
}

// podEvents records an event on each pod the claim is reserved for.
func (h *deviceHealth) podEvents(ctx context.Context, r prepare.ClaimRecord, warning bool, reason, msg string) {
	if h.client == nil || h.events == nil {
		return
	}
	claim, err := h.client.ResourceV1().ResourceClaims(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reading a claim for its pods' health events", "claim", klog.KRef(r.Namespace, r.Name))
		return
	}
	for _, ref := range claim.Status.ReservedFor {
		if ref.Resource == "pods" && ref.APIGroup == "" {
			h.events(corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: r.Namespace, Name: ref.Name, UID: ref.UID},
				warning, reason, msg+" (claim "+r.Namespace+"/"+r.Name+")")
		}
	}
}

// recorderEvents records events through rec.
func recorderEvents(rec record.EventRecorder) func(corev1.ObjectReference, bool, string, string) {
	return func(pod corev1.ObjectReference, warning bool, reason, message string) {
		t := corev1.EventTypeNormal
		if warning {
			t = corev1.EventTypeWarning
		}
		rec.Event(&pod, t, reason, message)
	}
}

// watch reports every published device's health to the kubelet: at once,
// after each change, and within the kubelet's 30 s lease.
func (h *deviceHealth) watch(devices func() map[string]slices.Entry, wake func() (<-chan struct{}, func())) func(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return func(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
		woken, stop := wake()
		defer stop()
		refresh := time.NewTicker(20 * time.Second)
		defer refresh.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case reports <- h.report(devices()):
			}
			select {
			case <-ctx.Done():
				return nil
			case <-woken:
			case <-refresh.C:
			}
		}
	}
}

// WithHealth is res as the agent would publish it now: with the taint of
// every device its health sources call unhealthy at a first look (a NIC
// whose link is down). It is what `carve discover` prints; reasons of
// events (a GPU's XIDs) need the running agent.
func WithHealth(cfg *nodeconfig.NodeConfig, node, root string, res slices.Result) (resourceslice.DriverResources, map[string]health.Status) {
	h := newDeviceHealth(cfg, node, "", root, nil)
	h.rescanned(nil, res.Index)
	return h.publishable(res.Resources), h.tracker.Snapshot()
}
