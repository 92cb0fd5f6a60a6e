package app

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

func heldClaimObj(ns, name, driver, pod string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "r", Driver: driver, Pool: "node-a", Device: "nic-eth1"}}}}
	if pod != "" {
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: types.UID(pod + "-uid")}}
	}
	return c
}

var agentsDS = types.NamespacedName{Namespace: "carve-system", Name: "carve-agent"}

// The hook passes with no claim of the driver reserved (another driver's,
// or one of carve's allocated but not reserved, do not count), refuses
// naming each one that is, deletes their pods only when asked (flag or the
// DaemonSet's annotation), and then passes once the claims are released.
func TestUninstallCheck(t *testing.T) {
	ctx := context.Background()
	// p1 asks for no grace period, p2 for 30 s.
	pods := []runtime.Object{
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p1", UID: "p1-uid"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To(int64(0))}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "p2", UID: "p2-uid"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To(int64(30))}},
	}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: agentsDS.Namespace, Name: agentsDS.Name}}

	idle := fake.NewClientset(heldClaimObj("team-a", "other", "gpu.example.com", "p1"), heldClaimObj("team-a", "free", "carve.dev", ""), ds)
	var out bytes.Buffer
	if err := (UninstallCheck{Client: idle, DriverName: "carve.dev", DaemonSet: agentsDS, Out: &out}).Run(ctx); err != nil {
		t.Errorf("no carve claim reserved: %v\n%s", err, out.String())
	}

	objs := append([]runtime.Object{heldClaimObj("team-a", "c1", "carve.dev", "p1"), heldClaimObj("team-b", "c2", "carve.dev", "p2"), ds}, pods...)
	cs := fake.NewClientset(objs...)
	out.Reset()
	err := UninstallCheck{Client: cs, DriverName: "carve.dev", DaemonSet: agentsDS, Out: &out}.Run(ctx)
	if !errors.Is(err, ErrClaimsHeld) {
		t.Fatalf("claims reserved: %v, want ErrClaimsHeld", err)
	}
	for _, want := range []string{"claim team-a/c1 (node-a/nic-eth1) reserved for pod p1", "claim team-b/c2", DeleteSharePodsAnnotation + "=true"} {
		if !strings.Contains(out.String()+err.Error(), want) {
			t.Errorf("the refusal does not say %q:\n%s\n%v", want, out.String(), err)
		}
	}
	if p, _ := cs.CoreV1().Pods("team-a").List(ctx, metav1.ListOptions{}); len(p.Items) != 1 {
		t.Errorf("a refusal deleted pods")
	}

	// Annotated: the pods are deleted; the claim controller then releases
	// the claims (done here by a reactor on the pods' deletion).
	ds.Annotations = map[string]string{DeleteSharePodsAnnotation: "true"}
	if _, err := cs.AppsV1().DaemonSets(ds.Namespace).Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var deleted []string
	grace := map[string]*int64{}
	cs.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		d := a.(k8stesting.DeleteAction)
		deleted = append(deleted, d.GetNamespace()+"/"+d.GetName())
		grace[d.GetName()] = d.GetDeleteOptions().GracePeriodSeconds
		go func() {
			time.Sleep(200 * time.Millisecond)
			claims, _ := cs.ResourceV1().ResourceClaims(d.GetNamespace()).List(context.Background(), metav1.ListOptions{})
			for i := range claims.Items {
				c := claims.Items[i]
				c.Status.ReservedFor = nil
				_, _ = cs.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(context.Background(), &c, metav1.UpdateOptions{})
			}
		}()
		return false, nil, nil
	})
	out.Reset()
	if err := (UninstallCheck{Client: cs, DriverName: "carve.dev", DaemonSet: agentsDS, Timeout: 10 * time.Second, Out: &out}).Run(ctx); err != nil {
		t.Fatalf("annotated: %v\n%s", err, out.String())
	}
	if len(deleted) != 2 {
		t.Errorf("deleted %v, want both pods", deleted)
	}
	// A pod of no grace period is deleted with 1 s: with none it would
	// leave the API server before the kubelet unprepared its claims.
	if g := grace["p1"]; g == nil || *g != 1 {
		t.Errorf("p1 (terminationGracePeriodSeconds 0) deleted with grace period %v, want 1 s", g)
	}
	if g := grace["p2"]; g != nil {
		t.Errorf("p2 deleted with grace period %d, want its own (none given)", *g)
	}

	// Pods that never let go: the hook gives up after its timeout.
	stuck := fake.NewClientset(heldClaimObj("team-a", "c1", "carve.dev", "p1"), pods[0])
	out.Reset()
	err = UninstallCheck{Client: stuck, DriverName: "carve.dev", DeletePods: true, Timeout: 1500 * time.Millisecond, Out: &out}.Run(ctx)
	if !errors.Is(err, ErrClaimsHeld) {
		t.Errorf("claims never released: %v, want ErrClaimsHeld", err)
	}
}

// The agent's watch tells an uninstall (its DaemonSet deleted) from
// everything else; a DaemonSet it never saw tells it nothing.
func TestDaemonSetWatch(t *testing.T) {
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: agentsDS.Namespace, Name: agentsDS.Name}}
	cs := fake.NewClientset(ds)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen atomic.Int32
	w := &daemonSetWatch{client: cs, namespace: ds.Namespace, name: ds.Name, onDeleted: func() { seen.Add(1) }}
	go w.run(ctx)
	deadline := time.Now().Add(5 * time.Second)
	for !w.seenOnce.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if w.uninstalling(ctx) {
		t.Fatal("uninstalling with the DaemonSet in place")
	}
	if err := cs.AppsV1().DaemonSets(ds.Namespace).Delete(ctx, ds.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for !w.deleted.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !w.uninstalling(ctx) || seen.Load() != 1 {
		t.Errorf("after the DaemonSet's deletion: uninstalling %v, onDeleted ran %d times; want true, once", w.uninstalling(ctx), seen.Load())
	}

	// Made anew (deleted with --cascade=orphan, then adopted again): not
	// an uninstall any more.
	if _, err := cs.AppsV1().DaemonSets(ds.Namespace).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for w.deleted.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if w.uninstalling(ctx) {
		t.Error("uninstalling after the DaemonSet was made again")
	}

	never := &daemonSetWatch{client: fake.NewClientset(), namespace: "x", name: "y"}
	if never.uninstalling(ctx) {
		t.Error("an agent that never saw its DaemonSet thinks it is uninstalled")
	}

	// Signalled before its watch saw the deletion: the agent asks, and
	// runs onDeleted (the Node event) before it stops, once.
	var late atomic.Int32
	unwatched := &daemonSetWatch{client: fake.NewClientset(), namespace: "x", name: "y", onDeleted: func() { late.Add(1) }}
	unwatched.seenOnce.Store(true)
	first := unwatched.uninstalling(ctx)
	again := unwatched.uninstalling(ctx)
	if !first || !again || late.Load() != 1 {
		t.Errorf("deletion seen only at the stop: uninstalling %v then %v, onDeleted ran %d times; want true, true, once", first, again, late.Load())
	}
}
