package main

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/carve-dra/carve/cmd/carve/app"
	"github.com/carve-dra/carve/gpu/memslice"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/prepare/hostcgroup"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

type agentFlags struct {
	kubeconfig, nodeName, root, cpuCacheRoot, fpgaRoot    string
	configFile                                            string
	registrarDir, pluginsDir, cdiDir, stateDir            string
	metricsAddr, healthAddr, podUID, hostNetns, bpfPinDir string
	profiling                                             bool
	nvidiaDriverRoot, nvidiaCDIHook, nvmlReplay           string
	nvmlReplayProcesses                                   string
	mpsShmSize                                            string
	mpsCgroup                                             string
	mpsCapabilities                                       []string
	mpsContextReserve                                     string
	daemonSet                                             string
	rescan, nvmlTimeout, registrationWait                 time.Duration
	qps                                                   float64
	burst                                                 int
}

func newAgentCommand() *cobra.Command {
	var f agentFlags
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "run the kubelet plugin: publish slices, prepare claims",
		Long: "Run the kubelet plugin: publish this node's slices, prepare and unprepare its claims. " +
			"Memory: the Go garbage collector runs at GOGC=50 unless GOGC is set (GOMEMLIMIT, when set, is honoured as well); " +
			"its heap is a few MB, so the halved headroom costs little CPU and keeps the resident set small.",
		Args: noArgs,
		RunE: work(func(cmd *cobra.Command) error {
			tuneAgentGC()
			return runAgent(cmd.Context(), f)
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; in-cluster config when empty")
	fs.StringVar(&f.nodeName, "node-name", defaultNodeName(), "this node's name: $NODE_NAME when set, else the hostname")
	fs.StringVar(&f.root, "root", "/", "host root to read sysfs and procfs under")
	fs.StringVar(&f.cpuCacheRoot, "cpu-cache-root", "", "root to read the CPU cache tree (sys/devices/system/cpu, sys/fs/resctrl) under instead of --root; for nodes whose sysfs lacks cpu*/cache, and tests")
	fs.StringVar(&f.fpgaRoot, "fpga-root", "", "root to read FPGA cards (PCI functions of class 0x12, their sysfs trees and /dev nodes) under instead of --root; for tests")
	fs.StringVar(&f.configFile, "config", "", "NodeConfig file (carve.dev/v1alpha1)")
	fs.StringVar(&f.registrarDir, "kubelet-registrar-dir", "/var/lib/kubelet/plugins_registry", "kubelet plugin registration directory")
	fs.StringVar(&f.pluginsDir, "kubelet-plugins-dir", "/var/lib/kubelet/plugins", "kubelet plugins directory; the socket goes in <dir>/<driver name>")
	fs.StringVar(&f.cdiDir, "cdi-dir", "/var/run/cdi", "directory for the CDI specs of prepared claims")
	fs.StringVar(&f.stateDir, "state-dir", envOr(envStateDir, defaultStateDir), "directory for the checkpoint and claim files; default $"+envStateDir+", else "+defaultStateDir)
	fs.StringVar(&f.metricsAddr, "metrics-addr", "127.0.0.1:9464", "address for /metrics and /healthz over HTTP (loopback by default: with hostNetwork anything wider is the node's own address); empty turns it off")
	fs.BoolVar(&f.profiling, "profiling", false, "serve Go's pprof profiles under /debug/pprof/ on --metrics-addr (CPU, heap, goroutines, execution traces); off by default, as they expose the agent's internals")
	fs.StringVar(&f.healthAddr, "health-addr", "127.0.0.1:9465", "address for the gRPC health service; the chart binds the pod IP, which the kubelet's liveness probe dials; empty turns it off")
	fs.StringVar(&f.podUID, "pod-uid", os.Getenv("POD_UID"), "the agent pod's UID (downward API) for seamless rolling updates; empty turns them off")
	fs.DurationVar(&f.rescan, "rescan-interval", time.Minute, "how often to rediscover hardware; link events rediscover at once")
	fs.DurationVar(&f.registrationWait, "registration-wait", 30*time.Second, "how long to wait at start for the kubelet to register the plugin before publishing the node's devices anyway (pods placed before the kubelet knows the driver wait out its retry back-off, a minute or more); 0 publishes at once")
	fs.Float64Var(&f.qps, "kube-api-qps", 200, "queries per second to the API server; every prepare reads its claims (the claims' status writes have a limit of their own, the same)")
	fs.IntVar(&f.burst, "kube-api-burst", 400, "burst of queries to the API server")
	fs.StringVar(&f.hostNetns, "host-netns", "", "the node's network namespace (a path); default <root>/proc/1/ns/net, else the agent's own")
	fs.StringVar(&f.bpfPinDir, "bpf-pin-dir", envOr(envPinDir, defaultPinDir), "where the classifier's maps and links are pinned (on bpffs), so limits hold while the agent restarts; default $"+envPinDir+", else "+defaultPinDir)
	fs.StringVar(&f.nvidiaDriverRoot, "nvidia-driver-root", "/", "where the host's NVIDIA driver is installed (libnvidia-ml.so.1, libcuda, nvidia-smi are searched below it), e.g. /usr/local/nvidia; read below --root")
	fs.StringVar(&f.nvidiaCDIHook, "nvidia-cdi-hook", "", "the host's nvidia-cdi-hook, to run the NVIDIA container hooks; without it carve mounts the libraries under their soname links, beside them and in the C library loader's default directories, and leaves the image's LD_LIBRARY_PATH as it is")
	fs.StringVar(&f.nvmlReplay, "nvml-replay", "", "answer NVML from this replay file instead of the library (tests, what-if)")
	fs.StringVar(&f.nvmlReplayProcesses, "nvml-replay-processes", "", "with --nvml-replay: answer the GPUs' processes from this file, read on every query (format: go doc ./gpu/nvmlreplay ProcessesFile)")
	fs.DurationVar(&f.nvmlTimeout, "nvml-timeout", 10*time.Second, "bound on every NVML call; a driver that hangs costs the node its GPUs, never the agent")
	fs.StringVar(&f.mpsCgroup, "mps-cgroup", "carve-mps", "cgroup, below the root of each of the host's cgroup hierarchies, that claims' MPS daemons are moved into so that they outlive the agent's pod (their clients lose their server with them); empty leaves them in the agent's container")
	fs.StringVar(&f.mpsShmSize, "mps-shm-size", "1Gi", "size of the tmpfs each claim's GPU memory shares' containers and MPS daemons have as /dev/shm, one per claim (a quantity); pages are charged to the pods that write them")
	fs.StringSliceVar(&f.mpsCapabilities, "mps-capabilities", mps.DefaultCapabilities, "the only capabilities claims' MPS control daemons and the servers they start keep (a list; \"all\" keeps the agent's): by default a container runtime's default set less the network ones, so that a daemon every tenant of its claim talks to holds no CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_BPF and the like")
	fs.StringVar(&f.mpsContextReserve, "mps-context-reserve", resource.NewQuantity(memslice.DefaultContextReserve, resource.BinarySI).String(), "the part of each mps-policed GPU memory slice left to a CUDA process's context (a quantity): MPS's ceiling is the slice less this, since NVML's figure of a process, which policing holds to the slice, counts its context, which MPS's ceiling may not; an H100 with driver 580 read 610 MiB beside an 8 GiB allocation. A slice no larger is refused")
	fs.StringVar(&f.daemonSet, "daemonset", os.Getenv(envDaemonSet), "the agent's own DaemonSet, as namespace/name (default $"+envDaemonSet+", which the chart sets): "+
		"an agent that stops while it is being deleted (an uninstall) removes carve's state from the node, unless claims are still prepared; empty never does")
	must(cmd.MarkFlagFilename("kubeconfig"))
	must(cmd.MarkFlagFilename("config", "yaml", "yml"))
	must(cmd.MarkFlagDirname("root"))
	return cmd
}

// agentGCPercent is the agent's GOGC unless the environment sets one. The
// agent's live heap is small (about 3 MB idle, 6 MB with 500 claims held)
// and its garbage comes in bursts (prepares, rescans), which at the
// runtime's default of 100 double the heap the process keeps resident: 50
// keeps a half of the live heap as headroom instead. BenchmarkAgentMemory
// (deploy/e2e) measured 500 claims held: VmHWM 61-70 MiB at 100, 57 at 50.
const agentGCPercent = 50

// tuneAgentGC sets the agent's GC percent, unless GOGC says otherwise.
func tuneAgentGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(agentGCPercent)
	}
}

func runAgent(ctx context.Context, f agentFlags) error {
	cfg, err := nodeconfig.Load(f.configFile)
	if err != nil {
		return err
	}
	shm, err := resource.ParseQuantity(f.mpsShmSize)
	if err != nil || shm.Sign() <= 0 {
		return fmt.Errorf("--mps-shm-size %q: want a positive quantity such as 1Gi", f.mpsShmSize)
	}
	reserve, err := resource.ParseQuantity(f.mpsContextReserve)
	if err != nil || reserve.Sign() < 0 {
		return fmt.Errorf("--mps-context-reserve %q: want a quantity such as 640Mi, or 0", f.mpsContextReserve)
	}
	mpsCaps, err := mps.ParseCapabilities(f.mpsCapabilities)
	if err != nil {
		return fmt.Errorf("--mps-capabilities: %w", err)
	}
	if f.mpsCgroup != "" {
		if err := (hostcgroup.Group{Name: f.mpsCgroup}).Validate(); err != nil {
			return fmt.Errorf("--mps-cgroup: %w", err)
		}
	}
	var ds types.NamespacedName
	if f.daemonSet != "" {
		ns, name, ok := strings.Cut(f.daemonSet, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return fmt.Errorf("--daemonset %q: want namespace/name", f.daemonSet)
		}
		ds = types.NamespacedName{Namespace: ns, Name: name}
	}
	restCfg, err := restConfig(f.kubeconfig)
	if err != nil {
		return err
	}
	// client-go's default of 5 QPS caps a driver at 5 claims a second,
	// since the helper reads every claim it prepares.
	restCfg.QPS, restCfg.Burst = float32(f.qps), f.burst
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kube client: %w", err)
	}
	// The claims' status writes get a client, and so a rate limit, of
	// their own: sharing one, a hundred pods' status writes spent the
	// tokens their claim reads waited for (issue 44).
	statusClient, err := kubernetes.NewForConfig(rest.CopyConfig(restCfg))
	if err != nil {
		return fmt.Errorf("kube client: %w", err)
	}
	return app.Run(ctx, app.Options{
		NodeName: f.nodeName, KubeClient: client, StatusClient: statusClient, Root: f.root, CPUCacheRoot: f.cpuCacheRoot, FPGARoot: f.fpgaRoot, Config: cfg,
		RegistrarDir: f.registrarDir, PluginsDir: f.pluginsDir, CDIDir: f.cdiDir, StateDir: f.stateDir,
		MetricsAddr: f.metricsAddr, Profiling: f.profiling, HealthAddr: f.healthAddr, PodUID: types.UID(f.podUID),
		Rescan: f.rescan, RegistrationWait: f.registrationWait, HostNetns: f.hostNetns, BPFPinDir: f.bpfPinDir,
		NVIDIADriverRoot: f.nvidiaDriverRoot, NVIDIACDIHook: f.nvidiaCDIHook, NVMLReplay: f.nvmlReplay, NVMLReplayProcesses: f.nvmlReplayProcesses, NVMLTimeout: f.nvmlTimeout,
		MPSShmSize:        uint64(shm.Value()),
		MPSCgroup:         f.mpsCgroup,
		MPSCapabilities:   mpsCaps,
		MPSContextReserve: uint64(reserve.Value()),
		DaemonSet:         ds,
		Version:           version,
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
