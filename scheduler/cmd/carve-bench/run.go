package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// result is what one scheduler achieved on one workload.
type result struct {
	label        string
	nodes, run   int
	pods, bound  int
	podsPerSec   float64
	used, min    int // devices in use; the fewest that could hold the shares
	pairs, align int // pods with a GPU and a NIC share; those under one PCIe root
	// cpuPerPod is the scheduler's CPU time (user and system) from the
	// first bind seen to the last, per pod bound in between: its own cost,
	// apart from the API server and etcd it shares the machine with.
	cpuPerPod time.Duration
}

// runOnce schedules the workload with s on a fresh namespace and measures it:
// pods are created and their claims made by the controller manager before the
// scheduler starts, so only scheduling is timed, from the first bind seen to
// the last.
func runOnce(ctx context.Context, c kubernetes.Interface, s scheduler, nodes, run int, specs []podSpec, dir, kubeconfig string, infos map[string]deviceInfo) (result, error) {
	logger := klog.FromContext(ctx).WithValues("scheduler", s.label, "nodes", nodes, "run", run)
	res := result{label: s.label, nodes: nodes, run: run, pods: len(specs)}
	ns := fmt.Sprintf("bench-%s-%d-%d", s.label, nodes, run)
	if err := createTemplates(ctx, c, ns); err != nil {
		return res, err
	}
	if os.Getenv("CARVE_BENCH_KEEP") == "" {
		defer cleanup(ctx, c, ns)
	}
	if err := parallel(ctx, len(specs), 16, func(i int) error {
		_, err := c.CoreV1().Pods(ns).Create(ctx, pod(ns, s.name, specs[i]), metav1.CreateOptions{})
		return err
	}); err != nil {
		return res, fmt.Errorf("create pods: %w", err)
	}
	if err := waitClaims(ctx, c, ns, len(specs)); err != nil {
		return res, err
	}
	logger.Info("Claims ready; starting the scheduler")

	binds := newBindLog()
	factory := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { binds.see(obj) },
		UpdateFunc: func(_, obj any) { binds.see(obj) },
	}); err != nil {
		return res, fmt.Errorf("pod informer: %w", err)
	}
	ictx, stopInformer := context.WithCancel(ctx)
	defer stopInformer()
	factory.Start(ictx.Done())
	factory.WaitForCacheSync(ictx.Done())

	p, err := s.start(ctx, dir, kubeconfig)
	if err != nil {
		return res, err
	}
	cpuAtFirst := waitBound(ctx, logger, binds, len(specs), p)
	cpuAtLast, cpuErr := processCPU(p.cmd.Process.Pid)
	p.stop()
	stopInformer()

	res.bound, res.podsPerSec = binds.rate()
	if cpuErr != nil || cpuAtFirst < 0 || res.bound < 2 {
		logger.Info("No CPU figure for the run", "err", cpuErr)
	} else {
		res.cpuPerPod = (cpuAtLast - cpuAtFirst) / time.Duration(res.bound-1)
	}
	res.used, res.min, res.pairs, res.align, err = placement(ctx, c, ns, infos)
	logger.Info("Run done", "bound", res.bound, "podsPerSecond", fmt.Sprintf("%.1f", res.podsPerSec), "cpuPerPod", res.cpuPerPod, "devicesUsed", res.used, "devicesMin", res.min, "pairs", res.pairs, "aligned", res.align)
	return res, err
}

// waitClaims waits until the controller manager has made every pod's claims.
func waitClaims(ctx context.Context, c kubernetes.Interface, ns string, pods int) error {
	err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, p := range list.Items {
			if len(p.Status.ResourceClaimStatuses) == len(p.Spec.ResourceClaims) {
				ready++
			}
		}
		return ready == pods, nil
	})
	if err != nil {
		return fmt.Errorf("claims of the pods in %s: %w", ns, err)
	}
	return nil
}

// waitBound returns once every pod is bound, no pod was bound for a minute
// after the first, the scheduler exited, or 15 minutes passed. It returns
// the scheduler's CPU time when the first bind was seen (-1 where it could
// not be read), watching every 20 ms until then so that the scheduler's
// start-up and informer sync stay out of it.
func waitBound(ctx context.Context, logger klog.Logger, b *bindLog, pods int, p *proc) time.Duration {
	start := time.Now()
	cpuAtFirst := time.Duration(-1)
	for {
		n, last := b.progress()
		if n > 0 && cpuAtFirst < 0 {
			if cpu, err := processCPU(p.cmd.Process.Pid); err == nil {
				cpuAtFirst = cpu
			}
		}
		switch {
		case n == pods:
			return cpuAtFirst
		case n > 0 && time.Since(last) > time.Minute:
			logger.Info("No progress for a minute", "bound", n, "pods", pods)
			return cpuAtFirst
		case time.Since(start) > 15*time.Minute:
			logger.Info("Timed out", "bound", n, "pods", pods)
			return cpuAtFirst
		}
		poll := 200 * time.Millisecond
		if n == 0 {
			poll = 20 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return cpuAtFirst
		case <-p.exited():
			logger.Info("Scheduler exited early; see its log", "bound", n)
			return -1
		case <-time.After(poll):
		}
	}
}

// bindLog records when each pod was first seen bound.
type bindLog struct {
	mu          sync.Mutex
	seen        map[string]bool
	first, last time.Time
}

func newBindLog() *bindLog { return &bindLog{seen: map[string]bool{}} }

func (b *bindLog) see(obj any) {
	p, ok := obj.(*v1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen[p.Name] {
		return
	}
	b.seen[p.Name] = true
	if b.first.IsZero() {
		b.first = now
	}
	b.last = now
}

func (b *bindLog) progress() (int, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.seen), b.last
}

// rate is binds per second between the first and the last bind.
func (b *bindLog) rate() (int, float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.seen)
	d := b.last.Sub(b.first).Seconds()
	if n < 2 || d <= 0 {
		return n, 0
	}
	return n, float64(n-1) / d
}

// cleanup deletes the run's pods at once (no kubelet will), waits for the
// controller manager to drop their claims, and deletes the namespace, so
// the next run starts with every device free.
func cleanup(ctx context.Context, c kubernetes.Interface, ns string) {
	logger := klog.FromContext(ctx)
	zero := int64(0)
	if err := c.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		logger.Error(err, "Delete pods", "namespace", ns)
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := c.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		logger.Error(err, "Claims left behind", "namespace", ns)
	}
	if err := c.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		logger.Error(err, "Delete namespace", "namespace", ns)
	}
}
