// Command carve-scheduler is the upstream kube-scheduler, at the pinned
// Kubernetes version, with carve's score plugins registered (ShareFit and
// Topology; the upstream DynamicResources plugin still does the allocation)
// and a `plan` subcommand for what-if allocation planning.
package main

import (
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/carve-dra/carve/scheduler/pkg/sharefit"
	"github.com/carve-dra/carve/scheduler/pkg/topology"
)

func main() {
	os.Exit(cli.Run(command()))
}

// command is the scheduler command with carve's plugins and subcommands.
func command() *cobra.Command {
	cmd := app.NewSchedulerCommand(
		app.WithPlugin(sharefit.Name, sharefit.New),
		app.WithPlugin(topology.Name, topology.New),
	)
	cmd.Use = "carve-scheduler"
	cmd.AddCommand(planCommand())
	return cmd
}
