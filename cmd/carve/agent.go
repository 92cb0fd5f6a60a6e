package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/carve-dra/carve/prepare/agent"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

func runAgent(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file; in-cluster config when empty")
	nodeName := fs.String("node-name", defaultNodeName(), "this node's name (default: $NODE_NAME, else the hostname)")
	root := fs.String("root", "/", "host root to read sysfs and procfs under")
	cpuCacheRoot := fs.String("cpu-cache-root", "", "root to read the CPU cache tree (sys/devices/system/cpu, sys/fs/resctrl) under instead of --root; for nodes whose sysfs lacks cpu*/cache, and tests")
	configFile := fs.String("config", "", "NodeConfig file (carve.dev/v1alpha1)")
	registrarDir := fs.String("kubelet-registrar-dir", "/var/lib/kubelet/plugins_registry", "kubelet plugin registration directory")
	pluginsDir := fs.String("kubelet-plugins-dir", "/var/lib/kubelet/plugins", "kubelet plugins directory; the socket goes in <dir>/<driver name>")
	cdiDir := fs.String("cdi-dir", "/var/run/cdi", "directory for the CDI specs of prepared claims")
	stateDir := fs.String("state-dir", "/var/lib/carve", "directory for the checkpoint and claim files")
	metricsAddr := fs.String("metrics-addr", ":9464", "address for /metrics and /healthz over HTTP; empty turns it off")
	healthAddr := fs.String("health-addr", ":9465", "address for the gRPC health service (liveness probe); empty turns it off")
	podUID := fs.String("pod-uid", os.Getenv("POD_UID"), "the agent pod's UID (downward API) for seamless rolling updates; empty turns them off")
	rescan := fs.Duration("rescan-interval", time.Minute, "how often to rediscover hardware; link events rediscover at once")
	qps := fs.Float64("kube-api-qps", 200, "queries per second to the API server; every prepare reads its claims")
	burst := fs.Int("kube-api-burst", 400, "burst of queries to the API server")
	hostNetns := fs.String("host-netns", "", "the node's network namespace (a path); default <root>/proc/1/ns/net, else the agent's own")
	bpfPinDir := fs.String("bpf-pin-dir", "/sys/fs/bpf/carve", "where the classifier's maps and links are pinned (on bpffs), so limits hold while the agent restarts")
	ctx = withLogging(ctx, fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	cfg, err := nodeconfig.Load(*configFile)
	if err != nil {
		return err
	}
	restCfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	// client-go's default of 5 QPS caps a driver at 5 claims a second,
	// since the helper reads every claim it prepares.
	restCfg.QPS, restCfg.Burst = float32(*qps), *burst
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kube client: %w", err)
	}
	return agent.Run(ctx, agent.Options{
		NodeName: *nodeName, KubeClient: client, Root: *root, CPUCacheRoot: *cpuCacheRoot, Config: cfg,
		RegistrarDir: *registrarDir, PluginsDir: *pluginsDir, CDIDir: *cdiDir, StateDir: *stateDir,
		MetricsAddr: *metricsAddr, HealthAddr: *healthAddr, PodUID: types.UID(*podUID),
		Rescan: *rescan, HostNetns: *hostNetns, BPFPinDir: *bpfPinDir,
	})
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (or pass --kubeconfig): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}
