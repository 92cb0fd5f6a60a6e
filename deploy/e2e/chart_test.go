package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

const chartNamespace = "carve-system"

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// renderChart runs `helm template` on the chart with extra --set values
// (or other flags, given as --flag=value).
func renderChart(t testing.TB, sets ...string) []byte {
	t.Helper()
	helm := os.Getenv("CARVE_HELM")
	if helm == "" {
		var err error
		if helm, err = exec.LookPath("helm"); err != nil {
			if os.Getenv("CARVE_E2E_REQUIRED") == "1" {
				t.Fatal("no helm: set CARVE_HELM (make e2e builds it with deploy/cluster/build-tools.sh)")
			}
			t.Skip("no helm: set CARVE_HELM or put helm on PATH")
		}
	}
	args := []string{"template", "carve", filepath.Join(repoRoot(), "deploy/chart/carve"), "--namespace", chartNamespace, "--kube-version", "1.37.0"}
	for _, s := range sets {
		if strings.HasPrefix(s, "--") {
			args = append(args, s) // another flag, as --flag=value
			continue
		}
		args = append(args, "--set", s)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(helm, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	return out
}

func decodeObjects(t testing.TB, manifest []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := yamlutil.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decode rendered chart: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	return objs
}

type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newApplier(t testing.TB, cfg *rest.Config) *applier {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cs.Discovery()))}
}

// apply server-side applies an object, for real or as a dry run.
func (a *applier) apply(ctx context.Context, u *unstructured.Unstructured, dryRun bool) error {
	m, err := a.mapper.RESTMapping(u.GroupVersionKind().GroupKind(), u.GroupVersionKind().Version)
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = a.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	data, err := u.MarshalJSON()
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: "carve-e2e", Force: ptr.To(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = ri.Patch(ctx, u.GetName(), types.ApplyPatchType, data, opts)
	return err
}

func (a *applier) delete(ctx context.Context, u *unstructured.Unstructured) error {
	m, err := a.mapper.RESTMapping(u.GroupVersionKind().GroupKind(), u.GroupVersionKind().Version)
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = a.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	return ri.Delete(ctx, u.GetName(), metav1.DeleteOptions{})
}

func restConfigFromEnv(t testing.TB) *rest.Config {
	t.Helper()
	client(t) // skips without a cluster
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("CARVE_KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The committed plain manifests are exactly what the chart renders.
func TestManifestsMatchChart(t *testing.T) {
	rendered := renderChart(t, "createNamespace=true")
	committed, err := os.ReadFile(filepath.Join(repoRoot(), "deploy/manifests/carve.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rendered, committed) {
		t.Errorf("deploy/manifests/carve.yaml is stale: run make manifests")
	}
}

// The rendered chart is valid to the real API server: every object passes a
// server-side dry-run apply.
func TestChartAppliesToAPIServer(t *testing.T) {
	cfg := restConfigFromEnv(t)
	ctx := context.Background()
	a := newApplier(t, cfg)
	for _, sets := range [][]string{
		{"createNamespace=true"},
		{"createNamespace=true", "nodeConfig=apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\n", "kubeletDir=/var/lib/k"},
		// Metrics opted in to scraping, with the NetworkPolicy naming
		// the scraper.
		{"createNamespace=true", "metricsHost=$(POD_IP)",
			"metricsNetworkPolicy.from[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
			"metricsNetworkPolicy.from[0].podSelector.matchLabels.app=prometheus"},
	} {
		scraped := slices.Contains(sets, "metricsHost=$(POD_IP)")
		objs := decodeObjects(t, renderChart(t, sets...))
		kinds := map[string]int{}
		for _, u := range objs {
			kinds[u.GetKind()]++
			if u.GetKind() == "DeviceClass" {
				checkExtendedResourceName(t, u.GetName(), u.Object)
			}
			if u.GetKind() == "Namespace" {
				// Namespaced dry runs need the namespace to exist.
				if err := a.apply(ctx, u, false); err != nil {
					t.Fatalf("namespace: %v", err)
				}
				continue
			}
			if err := a.apply(ctx, u, true); err != nil {
				t.Errorf("%s %s rejected: %v", u.GetKind(), u.GetName(), err)
			}
		}
		// The agent's, and the pre-delete hook's (ServiceAccount,
		// ClusterRole and binding, Job); the agent's Role reads its
		// DaemonSet.
		for kind, n := range map[string]int{"DaemonSet": 1, "ClusterRole": 2, "ClusterRoleBinding": 2, "ServiceAccount": 2, "Role": 1, "RoleBinding": 1, "Job": 1,
			"ValidatingAdmissionPolicy": 1, "ValidatingAdmissionPolicyBinding": 1, "DeviceClass": 5, "NetworkPolicy": map[bool]int{true: 1}[scraped]} {
			if kinds[kind] != n {
				t.Errorf("rendered %d %s, want %d (sets %v)", kinds[kind], kind, n, sets)
			}
		}
	}
}

// The admission policy lets an agent's ServiceAccount token, bound to a pod
// on node A, write node A's slices and nothing else.
func TestPolicyConfinesAgentToItsNode(t *testing.T) {
	env := setupNodeBound(t)
	ctx := context.Background()
	admin := env.admin
	agent := env.agentOn(t, "policy-node-a")
	waitForPolicy(t, agent, "policy-node-b")
	if _, err := agent.ResourceV1().ResourceSlices().Create(ctx, policySlice("policy-own-node", "policy-node-a", "policy-node-a", "carve.dev"), metav1.CreateOptions{}); err != nil {
		t.Errorf("node A's agent writing node A's slice: %v", err)
	} else {
		_ = admin.ResourceV1().ResourceSlices().Delete(ctx, "policy-own-node", metav1.DeleteOptions{})
	}
	if _, err := agent.ResourceV1().ResourceSlices().Create(ctx, policySlice("policy-no-node", "", "policy-node-a", "carve.dev"), metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "without a node") {
		t.Errorf("a cluster-wide slice from node A's agent: %v; want denied", err)
	}
	checkClaimStatusRights(t, admin, agent)
	// Someone else (the admin) is not confined by the policy.
	if _, err := admin.ResourceV1().ResourceSlices().Create(ctx, policySlice("policy-admin", "policy-node-b", "policy-node-b", "other.example.com"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("admin writing node B's slice: %v", err)
	}
}

// nodeBoundEnv is the chart's RBAC and admission policy applied for real
// (no DaemonSet), with the nodes policy-node-a and policy-node-b, which
// nothing runs: they anchor the agents' tokens.
type nodeBoundEnv struct {
	cfg   *rest.Config
	admin kubernetes.Interface
}

func setupNodeBound(t *testing.T) *nodeBoundEnv {
	t.Helper()
	cfg := restConfigFromEnv(t)
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(cfg)
	a := newApplier(t, cfg)
	for _, u := range decodeObjects(t, renderChart(t, "createNamespace=true", "deviceClasses=false")) {
		if u.GetKind() == "DaemonSet" {
			continue
		}
		if err := a.apply(ctx, u, false); err != nil {
			t.Fatalf("apply %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		if u.GetKind() != "Namespace" {
			// Leave the cluster as found: a later helm install of the
			// chart must own these objects.
			t.Cleanup(func() { _ = a.delete(context.Background(), u) })
		}
	}
	for _, node := range []string{"policy-node-a", "policy-node-b"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	}
	return &nodeBoundEnv{cfg: cfg, admin: admin}
}

// agentOn is a client with the agent's ServiceAccount token bound to a pod
// on node, as the kubelet gives the agent's pod there: the API server puts
// the node's name in the token's user info. Nothing runs the pod.
func (e *nodeBoundEnv) agentOn(t *testing.T, node string) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	pod, err := e.admin.CoreV1().Pods(chartNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-on-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "carve",
			Containers: []corev1.Container{{Name: "agent", Image: "carve:dev"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.admin.CoreV1().Pods(chartNamespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	})
	tok, err := e.admin.CoreV1().ServiceAccounts(chartNamespace).CreateToken(ctx, "carve", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agentCfg := rest.AnonymousClientConfig(e.cfg)
	agentCfg.BearerToken = tok.Status.Token
	return kubernetes.NewForConfigOrDie(agentCfg)
}

// policySlice is a slice of node (none: all nodes) in pool of driver.
func policySlice(name, node, pool, driver string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.ResourceSliceSpec{
		Driver: driver, Pool: resourceapi.ResourcePool{Name: pool, ResourceSliceCount: 1}}}
	if node != "" {
		s.Spec.NodeName = ptr.To(node)
	} else {
		s.Spec.AllNodes = ptr.To(true)
	}
	return s
}

// waitForPolicy waits until the API server enforces the policy, which it
// loads a while after it is created: until agent's dry-run write of a slice
// of otherNode is denied.
func waitForPolicy(t *testing.T, agent kubernetes.Interface, otherNode string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := agent.ResourceV1().ResourceSlices().Create(context.Background(), policySlice("policy-other-node", otherNode, otherNode, "carve.dev"),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "may not modify ResourceSlices of node "+otherNode) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a slice for node %s from another node's agent: %v; want the policy's denial", otherNode, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkExtendedResourceName: the fpga, gpu and llc classes serve classic
// requests for carve.dev/<kind>; the NIC class none (a NIC share is asked
// for with its bandwidth, which a count cannot say).
func checkExtendedResourceName(t testing.TB, class string, obj map[string]any) {
	t.Helper()
	kind, _, _ := strings.Cut(class, ".")
	got, _, _ := unstructured.NestedString(obj, "spec", "extendedResourceName")
	// Whole devices only: a NIC is asked for by bandwidth and a MIG
	// device by profile, which a count in resources.limits cannot say.
	want := ""
	if slices.Contains([]string{"fpga", "gpu", "llc"}, kind) {
		want = "carve.dev/" + kind
	}
	if got != want {
		t.Errorf("DeviceClass %s extendedResourceName %q, want %q", class, got, want)
	}
}
