// Command carve-bench runs the stock kube-scheduler and carve-scheduler side
// by side on one control plane without kubelets: for each cluster size it
// creates that many Node objects with carve ResourceSlices (two GPUs and two
// NICs with consumable capacity each), then, alternating which goes first,
// lets each scheduler bind the same pods with bandwidth and GPU memory share
// claims, and prints pods/s and their ratio, packing (devices in use over
// the fewest possible) and GPU+NIC alignment, as medians over the runs.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

func main() {
	var (
		kubeconfig  = flag.String("kubeconfig", os.Getenv("CARVE_KUBECONFIG"), "admin kubeconfig of the control plane")
		schedConfig = flag.String("scheduler-kubeconfig", "", "kubeconfig the schedulers use (default: --kubeconfig)")
		stockBin    = flag.String("stock", "", "the stock kube-scheduler binary")
		carveBin    = flag.String("carve", "", "the carve-scheduler binary")
		sizes       = flag.String("nodes", "100,500", "cluster sizes, comma-separated")
		pods        = flag.Int("pods", 1000, "pods per run")
		runs        = flag.Int("runs", 3, "runs per scheduler and size")
		dir         = flag.String("dir", os.TempDir(), "where scheduler configs and logs go")
		port        = flag.Int("port", 50261, "first of two secure ports for the schedulers")
		wShareFit   = flag.Int("sharefit-weight", 3, "ShareFit's weight in carve-scheduler's profile")
		wTopology   = flag.Int("topology-weight", 3, "Topology's weight in carve-scheduler's profile")
		only        = flag.String("schedulers", "stock,carve", "which schedulers run, comma-separated (stock, carve); one alone for diagnosis, the ratio needs both")
	)
	klog.InitFlags(nil)
	flag.Parse()
	ctx := klog.NewContext(context.Background(), klog.Background())
	if err := run(ctx, *kubeconfig, *schedConfig, *stockBin, *carveBin, *sizes, *only, *pods, *runs, *dir, *port, carveProfile(*wShareFit, *wTopology)); err != nil {
		fmt.Fprintln(os.Stderr, "carve-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, schedConfig, stockBin, carveBin, sizeList, only string, pods, runs int, dir string, port int, profile string) error {
	if kubeconfig == "" || stockBin == "" || carveBin == "" {
		return fmt.Errorf("--kubeconfig, --stock and --carve are required")
	}
	all := []scheduler{
		{label: "stock", name: "bench-stock", binary: stockBin, port: port},
		{label: "carve", name: "carve-scheduler", binary: carveBin, port: port + 1, profile: profile},
	}
	var scheds []scheduler
	for _, s := range all {
		if slices.Contains(strings.Split(only, ","), s.label) {
			scheds = append(scheds, s)
		}
	}
	if len(scheds) == 0 {
		return fmt.Errorf("--schedulers: %q names neither stock nor carve", only)
	}
	if schedConfig == "" {
		schedConfig = kubeconfig
	}
	var sizes []int
	for _, s := range strings.Split(sizeList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("--nodes: %q is not a positive number", s)
		}
		sizes = append(sizes, n)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if err := ensureClasses(ctx, c); err != nil {
		return err
	}
	specs := workload(pods, 13)
	var results []result
	for _, n := range sizes {
		if err := deleteNodes(ctx, c); err != nil {
			return err
		}
		if err := createNodes(ctx, c, n); err != nil {
			return err
		}
		infos, err := devicesInfo(ctx, c)
		if err != nil {
			return err
		}
		for r := 1; r <= runs; r++ {
			order := scheds
			if r%2 == 0 {
				order = slices.Clone(scheds)
				slices.Reverse(order)
			}
			for _, s := range order {
				res, err := runOnce(ctx, c, s, n, r, specs, dir, schedConfig, infos)
				if err != nil {
					return fmt.Errorf("%s, %d nodes, run %d: %w", s.label, n, r, err)
				}
				results = append(results, res)
			}
		}
	}
	if err := deleteNodes(ctx, c); err != nil {
		return err
	}
	printTable(os.Stdout, sizes, results)
	return nil
}
