package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/deploy/e2e/kubeletstub"
	"github.com/carve-dra/carve/discovery/sysfstest"
)

var (
	carveOnce sync.Once
	carveBin  string
	carveErr  error
)

// carveBinary builds cmd/carve once for the test binary.
func carveBinary(t testing.TB) string {
	t.Helper()
	carveOnce.Do(func() {
		dir, err := os.MkdirTemp("", "carve-e2e-bin-")
		if err != nil {
			carveErr = err
			return
		}
		carveBin = filepath.Join(dir, "carve")
		// With the tags `make build` gives it: the binary run and
		// measured is the one shipped.
		tags, err := carveTags()
		if err != nil {
			carveErr = err
			return
		}
		out, err := exec.Command("go", "build", "-tags", tags, "-o", carveBin, "github.com/carve-dra/carve/cmd/carve").CombinedOutput()
		if err != nil {
			carveErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		// The static hook beside it, where the agent looks for it.
		hook := exec.Command("go", "build", "-o", filepath.Join(dir, "carve-hook"), "github.com/carve-dra/carve/cmd/carve-hook")
		hook.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := hook.CombinedOutput(); err != nil {
			carveErr = fmt.Errorf("go build carve-hook: %v\n%s", err, out)
		}
	})
	if carveErr != nil {
		t.Fatal(carveErr)
	}
	return carveBin
}

// carveTags is the line of cmd/carve/buildtags that is not a comment.
func carveTags() (string, error) {
	raw, err := os.ReadFile("../../cmd/carve/buildtags")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			return line, nil
		}
	}
	return "", fmt.Errorf("cmd/carve/buildtags: no tags")
}

// agentHost is one node's worth of directories for an agent run as a host
// process against a fixture root.
type agentHost struct {
	t          testing.TB
	node       string
	root       string
	dir        string
	kubeconfig string
	metrics    string
	health     string
	netns      string
	pins       string
	tree       *sysfstest.Tree
	rescan     string
	// args are more flags for the agent (a --config).
	args []string
	// noKubelet leaves the agent unregistered: start otherwise registers
	// its plugin in the background, as the kubelet's plugin watcher does
	// with a new socket (the agent publishes its devices only then).
	noKubelet bool
	proc      *exec.Cmd
	exited    chan error
	logs      *bytes.Buffer
	// stopKubelet ends the background registration.
	stopKubelet context.CancelFunc
}

func newAgentHost(t testing.TB, cs kubernetes.Interface, node string) *agentHost {
	t.Helper()
	tree := sysfstest.Typical(t.TempDir())
	tree.Write("dev/xclmgmt15104", "")
	// A short directory: unix socket paths are limited to 108 bytes, and a
	// rolling update's socket names carry a whole pod UID.
	dir, err := os.MkdirTemp("", "cva")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &agentHost{t: t, node: node, root: tree.Root, tree: tree, dir: dir, kubeconfig: os.Getenv("CARVE_KUBECONFIG"), rescan: "1h"}
	// The fixture's NICs, for real: a namespace standing in for the
	// node's, with links of the fixture's names, and a private pin
	// directory for the classifier.
	h.netns = nodeNetns(t, "ens1f0np0", "eth0")
	h.pins = filepath.Join("/sys/fs/bpf", "carve-e2e-"+string(uuid.NewUUID())[:8])
	t.Cleanup(func() { os.RemoveAll(h.pins) })
	_, err = cs.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.stop()
		ctx := context.Background()
		_ = cs.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{})
		_ = cs.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	})
	return h
}

func (h *agentHost) path(p string) string { return filepath.Join(h.dir, p) }

// nodeNetns makes a named network namespace with a veth pair per name (the
// name in the namespace, up), removed when the test ends.
func nodeNetns(t testing.TB, names ...string) string {
	t.Helper()
	ns := "cve2e" + string(uuid.NewUUID())[:8]
	mustRun(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	for i, n := range names {
		mustRun(t, "ip", "-n", ns, "link", "add", n, "type", "veth", "peer", "name", fmt.Sprintf("peer%d", i))
		mustRun(t, "ip", "-n", ns, "link", "set", n, "up")
		mustRun(t, "ip", "-n", ns, "link", "set", fmt.Sprintf("peer%d", i), "up")
	}
	return "/var/run/netns/" + ns
}

func mustRun(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// start runs `carve agent` with extra environment (a crash point).
func (h *agentHost) start(env ...string) {
	h.t.Helper()
	h.metrics, h.health = freeAddr(h.t), freeAddr(h.t)
	h.proc = exec.Command(carveBinary(h.t), "agent", "--kubeconfig", h.kubeconfig, "--node-name", h.node, "--root", h.root,
		"--kubelet-registrar-dir", h.path("plugins_registry"), "--kubelet-plugins-dir", h.path("plugins"),
		"--cdi-dir", h.path("cdi"), "--state-dir", h.path("state"), "--metrics-addr", h.metrics, "--health-addr", h.health,
		"--rescan-interval", h.rescan, "--host-netns", h.netns, "--bpf-pin-dir", h.pins, "--profiling", "-v", "1")
	h.proc.Args = append(h.proc.Args, h.args...)
	h.proc.Env = append(os.Environ(), env...)
	h.logs = &bytes.Buffer{}
	h.proc.Stdout, h.proc.Stderr = h.logs, h.logs
	if err := h.proc.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.exited = make(chan error, 1)
	go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(h.proc, h.exited)
	if h.stopKubelet != nil {
		h.stopKubelet()
	}
	if !h.noKubelet {
		ctx, cancel := context.WithCancel(context.Background())
		h.stopKubelet = cancel
		go func() {
			if p, err := kubeletstub.Register(ctx, h.path("plugins_registry"), "carve.dev", 20*time.Second); err == nil {
				_ = p.Close()
			}
		}()
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (h *agentHost) stop() error {
	if h.proc == nil {
		return nil
	}
	if h.stopKubelet != nil {
		h.stopKubelet()
	}
	_ = h.proc.Process.Signal(syscall.SIGTERM)
	defer func() { h.proc = nil }()
	select {
	case err := <-h.exited:
		return err
	case <-time.After(15 * time.Second):
		_ = h.proc.Process.Kill()
		return fmt.Errorf("agent did not stop within 15s of SIGTERM")
	}
}

// waitKilled waits for the agent to die at its crash point.
func (h *agentHost) waitKilled() {
	h.t.Helper()
	select {
	case err := <-h.exited:
		if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			h.t.Fatalf("agent exited with %v, want killed by SIGKILL at its crash point\n%s", err, h.logs)
		}
		h.proc = nil
	case <-time.After(15 * time.Second):
		h.t.Fatalf("agent did not reach its crash point\n%s", h.logs)
	}
}

func (h *agentHost) register(ctx context.Context) *kubeletstub.Plugin {
	h.t.Helper()
	p, err := kubeletstub.Register(ctx, h.path("plugins_registry"), "carve.dev", 20*time.Second)
	if err != nil {
		h.t.Fatalf("%v\nagent log:\n%s", err, h.logs)
	}
	return p
}

func (h *agentHost) scrape() string {
	h.t.Helper()
	resp, err := http.Get("http://" + h.metrics + "/metrics")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// files lists what is in one of the host's directories.
func (h *agentHost) files(dir string) []string {
	entries, _ := os.ReadDir(h.path(dir))
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

type alloc struct {
	request, device string
	share           bool
	egress          string
	// ingress is the share's ingress bandwidth; "" for none.
	ingress string
}

// makeClaim creates a claim and writes its allocation as the scheduler would.
func makeClaim(t testing.TB, cs kubernetes.Interface, node, name string, allocs ...alloc) kubeletstub.Claim {
	t.Helper()
	ctx := context.Background()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	for _, a := range allocs {
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: a.request,
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "carve-e2e"}})
	}
	created, err := cs.ResourceV1().ResourceClaims("default").Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaims("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	created.Status.Allocation = &resourceapi.AllocationResult{}
	for _, a := range allocs {
		r := resourceapi.DeviceRequestAllocationResult{Request: a.request, Driver: "carve.dev", Pool: node, Device: a.device}
		if a.share {
			r.ShareID = ptr.To(types.UID(uuid.NewUUID()))
			r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"egressBandwidth": resource.MustParse(a.egress)}
			if a.ingress != "" {
				r.ConsumedCapacity["ingressBandwidth"] = resource.MustParse(a.ingress)
			}
		}
		created.Status.Allocation.Devices.Results = append(created.Status.Allocation.Devices.Results, r)
	}
	if _, err := cs.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocate claim %s: %v", name, err)
	}
	return kubeletstub.Claim{Namespace: "default", Name: name, UID: string(created.UID)}
}

func waitSlices(t testing.TB, cs kubernetes.Interface, h *agentHost) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-h.exited:
			t.Fatalf("agent exited: %v\n%s", err, h.logs)
		default:
		}
		l, err := cs.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + h.node})
		if err == nil && len(l.Items) > 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no ResourceSlices for %s\nagent log:\n%s", h.node, h.logs)
}

// waitReaped waits, with the agent running, until its reaper has removed
// what unprepare queued (the share's interface and classes, the parent's
// egress shaper): Unprepare answers before that, so the node's state is
// only comparable once it is done.
func (h *agentHost) waitReaped(t *testing.T) {
	t.Helper()
	waitFor(t, "the reaper to remove the unprepared share", 30*time.Second, func() (bool, error) {
		s := h.state(t)
		return len(s.Links) == 0 && len(s.Classes) == 0, fmt.Errorf("node state %+v", s)
	})
}
