package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/carve-dra/carve/scheduler/pkg/plan"
	"github.com/carve-dra/carve/scheduler/pkg/sharefit"
)

// planCommand is `carve-scheduler plan`: flags and wiring only.
func planCommand() *cobra.Command {
	var (
		files      []string
		kubeconfig string
		fromAPI    bool
		namespace  string
		strategy   string
		output     string
	)
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Show where ResourceClaims would be allocated and the resulting use of every device",
		Long: `plan runs the structured allocator over ResourceSlices and ResourceClaims read
from files (-f, YAML or JSON, several documents or Lists per file, e.g. from
'carve discover' and 'kubectl get resourceclaims -o yaml') and/or a cluster
(--from-cluster), places each unallocated claim in order on the node the
ShareFit strategy prefers, and prints the placements and every device's use.
Classes named <kind>.carve.dev that the input lacks get the chart's
definition. No scheduler runs; nothing is written.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: false,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s := sharefit.Strategy(strategy)
			if s != sharefit.MostAllocated && s != sharefit.LeastAllocated {
				return fmt.Errorf("--strategy: %q is not %s or %s", strategy, sharefit.MostAllocated, sharefit.LeastAllocated)
			}
			if output != "text" && output != "json" {
				return fmt.Errorf("--output: %q is not text or json", output)
			}
			var in plan.Input
			if err := in.Load(files...); err != nil {
				return err
			}
			if fromAPI {
				rules := clientcmd.NewDefaultClientConfigLoadingRules()
				rules.ExplicitPath = kubeconfig
				cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
				if err != nil {
					return fmt.Errorf("kubeconfig: %w", err)
				}
				client, err := kubernetes.NewForConfig(cfg)
				if err != nil {
					return fmt.Errorf("client: %w", err)
				}
				if err := in.LoadCluster(cmd.Context(), client, namespace); err != nil {
					return err
				}
			}
			if len(in.Slices) == 0 {
				return fmt.Errorf("no ResourceSlices: give -f files or --from-cluster")
			}
			res, err := plan.Run(cmd.Context(), in, s)
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			return res.Print(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringSliceVarP(&files, "filename", "f", nil, "files with ResourceSlices, ResourceClaims and DeviceClasses (repeatable)")
	f.BoolVar(&fromAPI, "from-cluster", false, "also read ResourceSlices, ResourceClaims and DeviceClasses from the API server")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig for --from-cluster (default: $KUBECONFIG, ~/.kube/config)")
	f.StringVarP(&namespace, "namespace", "n", "", "namespace of the claims read with --from-cluster (default: all)")
	f.StringVar(&strategy, "strategy", string(sharefit.MostAllocated), "MostAllocated packs shares, LeastAllocated spreads them")
	f.StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}
