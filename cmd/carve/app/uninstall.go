package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/prepare/hostmount"
)

// An agent cannot tell from its SIGTERM why it stops: a rolling update, a
// drain and a restart keep the node's state for the next agent (limits hold
// in between), an uninstall must not. What tells them apart is the agent's
// DaemonSet: an uninstall deletes it (helm's default, background deletion,
// removes the object before the garbage collector deletes the pods; a
// foreground deletion marks it first), everything else leaves it. The
// agent watches its DaemonSet from the start, so that it knows before its
// pod is signalled, when its RBAC may already be gone.

// daemonSetWatch records whether the agent's DaemonSet is being deleted.
type daemonSetWatch struct {
	client          kubernetes.Interface
	namespace, name string
	// seenOnce: the DaemonSet existed; its absence means nothing before.
	seenOnce, deleted atomic.Bool
	// onDeleted runs once, as the deletion is first seen: while the
	// agent's RBAC, which helm deletes right after, most likely remains.
	onDeleted func()
	once      sync.Once
}

func (w *daemonSetWatch) observe(ds *appsv1.DaemonSet) {
	switch {
	case ds == nil:
	case ds.DeletionTimestamp != nil:
		w.markDeleted()
	default:
		// There again (deleted with --cascade=orphan, then made anew,
		// adopting this pod): not an uninstall.
		w.deleted.Store(false)
	}
}

func (w *daemonSetWatch) markDeleted() {
	w.deleted.Store(true)
	if w.onDeleted != nil {
		w.once.Do(w.onDeleted)
	}
}

// run watches until ctx ends, starting over after a failed or ended watch.
func (w *daemonSetWatch) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	sel := fields.OneTermEqualSelector("metadata.name", w.name).String()
	for ctx.Err() == nil {
		list, err := w.client.AppsV1().DaemonSets(w.namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err == nil && len(list.Items) == 0 {
			// Gone already; an agent started without its DaemonSet
			// (a bare pod, a test) never sees one and never cleans up.
			if w.seenOnce.Load() {
				w.markDeleted()
			}
		}
		if err == nil {
			for i := range list.Items {
				w.seenOnce.Store(true)
				w.observe(&list.Items[i])
			}
			err = w.watch(ctx, sel, list.ResourceVersion)
		}
		if err != nil && ctx.Err() == nil {
			logger.V(2).Info("Watching the agent's DaemonSet; retrying", "daemonSet", w.namespace+"/"+w.name, "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
}

func (w *daemonSetWatch) watch(ctx context.Context, sel, rv string) error {
	wi, err := w.client.AppsV1().DaemonSets(w.namespace).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: rv, AllowWatchBookmarks: true})
	if err != nil {
		return err
	}
	defer wi.Stop()
	for ev := range wi.ResultChan() {
		ds, _ := ev.Object.(*appsv1.DaemonSet)
		switch ev.Type {
		case watch.Deleted:
			w.markDeleted()
		case watch.Added, watch.Modified:
			w.seenOnce.Store(true)
			w.observe(ds)
		case watch.Error:
			return apierrors.FromObject(ev.Object)
		}
	}
	return errors.New("watch ended")
}

// uninstalling reports whether the DaemonSet is being deleted: what the
// watch saw, else (it may not have seen the last event yet) what the API
// server says now, within a short bound. An answer it cannot get is no.
// A yes runs onDeleted first where the watch has not, and waits for it where
// the watch is running it: the agent stops right after, and one whose
// signal comes before its watch event would otherwise leave no Event.
func (w *daemonSetWatch) uninstalling(ctx context.Context) bool {
	if !w.deleted.Load() && !w.deletedNow(ctx) {
		return false
	}
	w.markDeleted()
	return true
}

// deletedNow asks the API server whether the DaemonSet is being deleted.
func (w *daemonSetWatch) deletedNow(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	ds, err := w.client.AppsV1().DaemonSets(w.namespace).Get(ctx, w.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return w.seenOnce.Load()
	}
	if err != nil {
		klog.FromContext(ctx).Info("Cannot tell whether carve is being uninstalled; keeping the node's state", "daemonSet", w.namespace+"/"+w.name, "err", err)
		return false
	}
	return ds.DeletionTimestamp != nil
}

// uninstallNode removes carve's state from the node as its agent stops for
// good. With claims still prepared it keeps everything (their shares stay
// enforced by the pinned classifier) and says so where an operator will
// look: the agent's last log lines and an Event on the Node.
func uninstallNode(ctx context.Context, opts Options) error {
	logger := klog.FromContext(ctx)
	logger.Info("carve's DaemonSet is being deleted: removing carve's state from this node")
	co := CleanupOptions{
		DriverName: opts.Config.DriverName, Root: opts.Root, HostNetns: opts.HostNetns,
		StateDir: opts.StateDir, BPFPinDir: opts.BPFPinDir, CDIDir: opts.CDIDir,
		RegistrarDir: opts.RegistrarDir, PluginsDir: opts.PluginsDir,
	}
	if ns, err := hostmount.RuntimeNamespace(); err == nil {
		co.HostMountNS = ns
	}
	removed, err := CleanupNode(ctx, co)
	if errors.Is(err, ErrClaimsPrepared) {
		msg := uninstalledWithClaims(strings.TrimPrefix(err.Error(), ErrClaimsPrepared.Error()+": "))
		logger.Error(err, "Uninstalled with claims prepared; the node's state is kept", "message", msg)
		return nil
	}
	logger.Info("Removed carve's state from the node", "removed", removed)
	if err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	return nil
}

func uninstalledWithClaims(claims string) string {
	return fmt.Sprintf("carve was uninstalled while %s. Their shares stay enforced and carve's state stays on the node; "+
		"once their pods are gone, run `carve cleanup` on the node (--force takes the shares from running pods)", claims)
}

// warnClaimsKept records an Event on the Node, as the DaemonSet's deletion
// is first seen, where claims are prepared: the agent will keep the node's
// state as it stops. Its log goes with its pod.
func warnClaimsKept(ctx context.Context, opts Options) {
	claims, err := preparedClaims(opts.Root, opts.StateDir)
	if err != nil || len(claims) == 0 {
		return
	}
	nodeEvent(ctx, opts.KubeClient, opts.NodeName, "UninstalledWithClaims", uninstalledWithClaims(describeClaims(claims)))
}

// nodeEvent records a warning on the Node, written at once (an event
// broadcaster's queue would go with the process) and at best effort. A
// refusal is logged as an error, with the reason: on an uninstall, helm
// deletes the agent's RBAC and ServiceAccount right after its DaemonSet, so
// a late agent is refused (a loaded CI host's was: "events is forbidden"),
// and its log is then the only place that says what it kept.
func nodeEvent(ctx context.Context, client kubernetes.Interface, node, reason, msg string) {
	if client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: node + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node, UID: types.UID(node)},
		Reason:         reason, Message: msg, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "carve", Host: node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		klog.FromContext(ctx).Error(err, "Node event not recorded", "node", node, "reason", reason)
	}
}
