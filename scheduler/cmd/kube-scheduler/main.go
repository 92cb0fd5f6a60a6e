// Command kube-scheduler is the upstream kube-scheduler built as carve's own
// module, the way out-of-tree scheduler plugins are built. The scheduler
// issue registers carve's share-aware plugins here through
// app.WithPlugin; until then it is the stock scheduler at the pinned
// Kubernetes version.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	command := app.NewSchedulerCommand()
	os.Exit(cli.Run(command))
}
