package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// UninstallCheck is the chart's pre-delete hook: it stands between `helm
// uninstall` and pods that still hold carve's devices. Without DeletePods it
// refuses while a claim allocated from the driver is reserved for a pod
// (helm then keeps the release, and every share stays enforced); with it,
// it deletes those pods and waits until their claims are released, so that
// the agents stop on nodes with nothing prepared and clean them up.
type UninstallCheck struct {
	Client     kubernetes.Interface
	DriverName string
	DeletePods bool
	// DaemonSet is the agents' DaemonSet: annotated with
	// DeleteSharePodsAnnotation "true", it turns DeletePods on. A refused
	// uninstall leaves a helm release that cannot be upgraded any more,
	// so the operator's second thought cannot go through the chart's
	// values.
	DaemonSet types.NamespacedName
	// Timeout bounds the wait for deleted pods' claims to be released.
	Timeout time.Duration
	Out     io.Writer
}

// DeleteSharePodsAnnotation on the agents' DaemonSet lets the next
// uninstall delete the pods that hold the driver's devices.
const DeleteSharePodsAnnotation = "carve.dev/uninstall-delete-share-pods"

// ErrClaimsHeld is the check's refusal.
var ErrClaimsHeld = errors.New("claims still hold this driver's devices")

// heldClaim is a claim with this driver's devices, reserved for pods.
type heldClaim struct {
	claim   *resourceapi.ResourceClaim
	devices []string
	pods    []string
}

func (h heldClaim) String() string {
	return fmt.Sprintf("claim %s/%s (%s) reserved for pod %s", h.claim.Namespace, h.claim.Name, strings.Join(h.devices, ", "), strings.Join(h.pods, ", "))
}

// Run checks, and with DeletePods deletes and waits.
func (u UninstallCheck) Run(ctx context.Context) error {
	held, err := u.held(ctx)
	if err != nil {
		return err
	}
	if len(held) == 0 {
		fmt.Fprintf(u.Out, "no claim holds %s devices: the agents will clean up their nodes as they stop\n", u.DriverName)
		return nil
	}
	for _, h := range held {
		fmt.Fprintln(u.Out, h)
	}
	if !u.DeletePods && u.DaemonSet.Name != "" {
		ds, err := u.Client.AppsV1().DaemonSets(u.DaemonSet.Namespace).Get(ctx, u.DaemonSet.Name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("read the agents' DaemonSet %s: %w", u.DaemonSet, err)
		}
		if err == nil && ds.Annotations[DeleteSharePodsAnnotation] == "true" {
			fmt.Fprintf(u.Out, "%s is annotated %s=true: deleting the pods\n", u.DaemonSet, DeleteSharePodsAnnotation)
			u.DeletePods = true
		}
	}
	if !u.DeletePods {
		return fmt.Errorf("%w: %d claim(s), listed above. Delete their pods and uninstall again; or let the uninstall delete them: "+
			"kubectl -n %s annotate daemonset %s %s=true, then uninstall again (or install with uninstall.deleteSharePods=true)",
			ErrClaimsHeld, len(held), u.DaemonSet.Namespace, u.DaemonSet.Name, DeleteSharePodsAnnotation)
	}
	for _, h := range held {
		for _, ref := range h.claim.Status.ReservedFor {
			if ref.Resource != "pods" {
				continue
			}
			opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &ref.UID}}
			grace, err := u.deletionGrace(ctx, h.claim.Namespace, ref.Name)
			if err != nil {
				return err
			}
			opts.GracePeriodSeconds = grace
			err = u.Client.CoreV1().Pods(h.claim.Namespace).Delete(ctx, ref.Name, opts)
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return fmt.Errorf("delete pod %s/%s: %w", h.claim.Namespace, ref.Name, err)
			}
			fmt.Fprintf(u.Out, "deleted pod %s/%s\n", h.claim.Namespace, ref.Name)
		}
	}
	deadline := time.Now().Add(u.Timeout)
	for {
		held, err = u.held(ctx)
		if err != nil {
			return err
		}
		if len(held) == 0 {
			fmt.Fprintf(u.Out, "every claim of %s released: the agents will clean up their nodes as they stop\n", u.DriverName)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %d claim(s) still reserved %v after their pods were deleted (the first: %s)", ErrClaimsHeld, len(held), u.Timeout, held[0])
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// deletionGrace is the grace period to delete a pod with: its own (nil),
// but at least a second. A pod deleted with none (its
// terminationGracePeriodSeconds 0) leaves the API server at once, before
// the kubelet has stopped it and asked the agent to unprepare its claims,
// so its claims would be released, the hook would pass and the agents stop
// with the claims still prepared. With a grace period the kubelet removes
// the pod itself, once it has unprepared them (as kubectl delete
// --grace-period=0 without --force uses 1 s).
func (u UninstallCheck) deletionGrace(ctx context.Context, namespace, name string) (*int64, error) {
	p, err := u.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pod %s/%s: %w", namespace, name, err)
	}
	if g := p.Spec.TerminationGracePeriodSeconds; g != nil && *g < 1 {
		return ptr.To(int64(1)), nil
	}
	return nil, nil
}

// held lists the claims allocated from this driver and reserved for a
// consumer, in a stable order.
func (u UninstallCheck) held(ctx context.Context) ([]heldClaim, error) {
	var out []heldClaim
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := u.Client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list resource claims: %w", err)
		}
		for i := range list.Items {
			c := &list.Items[i]
			if c.Status.Allocation == nil || len(c.Status.ReservedFor) == 0 {
				continue
			}
			h := heldClaim{claim: c}
			for _, r := range c.Status.Allocation.Devices.Results {
				if r.Driver == u.DriverName {
					h.devices = append(h.devices, r.Pool+"/"+r.Device)
				}
			}
			if len(h.devices) == 0 {
				continue
			}
			for _, ref := range c.Status.ReservedFor {
				h.pods = append(h.pods, ref.Name)
			}
			out = append(out, h)
		}
		if list.Continue == "" {
			break
		}
		opts.Continue = list.Continue
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].claim.Namespace+"/"+out[i].claim.Name < out[j].claim.Namespace+"/"+out[j].claim.Name
	})
	return out, nil
}
