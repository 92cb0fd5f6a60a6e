package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-dra/carve/cmd/carve/app"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

func newCleanupCommand() *cobra.Command {
	var o app.CleanupOptions
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "remove carve's state from this node once no agent runs on it (what an uninstall does on each node)",
		Long: "Remove what carve's agent leaves on a node between claims: each parent's IFB and egress shaper pair " +
			"(with their classes), shares' interfaces left on the node, the BPF pins under --bpf-pin-dir (the classifier's links detach with them), " +
			"the driver's CDI specs, its kubelet plugin sockets, and the state directory (unmounting its bind mount onto itself, in --host-mount-ns). " +
			"An agent whose DaemonSet is deleted does this itself as it stops; this command is for a node whose agent could not " +
			"(it was uninstalled while claims were prepared, or killed). It refuses while an agent serves the node, and, unless --force, " +
			"while the checkpoint holds prepared claims: --force then deletes those claims' NIC share interfaces from their pods, " +
			"so that none goes on unshaped. Running it again does nothing.",
		Args: noArgs,
		RunE: work(func(cmd *cobra.Command) error {
			removed, err := app.CleanupNode(cmd.Context(), o)
			for _, r := range removed {
				fmt.Fprintln(cmd.OutOrStdout(), "removed", r)
			}
			if err == nil && len(removed) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "nothing of carve's on this node")
			}
			return err
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&o.DriverName, "driver-name", nodeconfig.DefaultDriverName, "the driver name the agent ran as")
	fs.StringVar(&o.Root, "root", "/", "host root whose proc/1/ns/net is the node's network namespace and whose processes' namespaces are searched with --force")
	fs.StringVar(&o.HostNetns, "host-netns", "", "the node's network namespace (a path); default <root>/proc/1/ns/net, else this process's")
	fs.StringVar(&o.StateDir, "state-dir", envOr(envStateDir, defaultStateDir), "the agent's state directory; default $"+envStateDir+", else "+defaultStateDir)
	fs.StringVar(&o.BPFPinDir, "bpf-pin-dir", envOr(envPinDir, defaultPinDir), "the agent's pin directory on bpffs; default $"+envPinDir+", else "+defaultPinDir)
	fs.StringVar(&o.CDIDir, "cdi-dir", "/var/run/cdi", "the agent's CDI directory (only the driver's specs are removed)")
	fs.StringVar(&o.RegistrarDir, "kubelet-registrar-dir", "/var/lib/kubelet/plugins_registry", "kubelet plugin registration directory")
	fs.StringVar(&o.PluginsDir, "kubelet-plugins-dir", "/var/lib/kubelet/plugins", "kubelet plugins directory")
	fs.StringVar(&o.HostMountNS, "host-mount-ns", "/proc/self/ns/mnt", "the host's mount namespace, where the state directory's bind mount onto itself is removed; empty leaves mounts alone")
	fs.BoolVar(&o.Force, "force", false, "clean up even with claims prepared, deleting their NIC share interfaces from their pods")
	return cmd
}

func newUninstallCheckCommand() *cobra.Command {
	var kubeconfig, daemonSet string
	u := app.UninstallCheck{}
	cmd := &cobra.Command{
		Use:   "uninstall-check",
		Short: "the chart's pre-delete hook: refuse an uninstall while pods hold the driver's devices (or delete them with --delete-pods)",
		Long: "Lists the ResourceClaims allocated from --driver-name and reserved for pods. With none it exits 0, and the agents, " +
			"seeing their DaemonSet deleted, clean up their nodes as they stop. With some it prints them and exits 1, which fails " +
			"`helm uninstall` and leaves every share enforced; with --delete-pods it deletes those pods instead and waits, up to --timeout, " +
			"until their claims are released.",
		Args: noArgs,
		RunE: work(func(cmd *cobra.Command) error {
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			if u.Client, err = kubernetes.NewForConfig(cfg); err != nil {
				return fmt.Errorf("kube client: %w", err)
			}
			if daemonSet != "" {
				ns, name, ok := strings.Cut(daemonSet, "/")
				if !ok || ns == "" || name == "" {
					return fmt.Errorf("--daemonset %q: want namespace/name", daemonSet)
				}
				u.DaemonSet = types.NamespacedName{Namespace: ns, Name: name}
			}
			u.Out = cmd.OutOrStdout()
			return u.Run(cmd.Context())
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; in-cluster config when empty")
	fs.StringVar(&u.DriverName, "driver-name", nodeconfig.DefaultDriverName, "the driver whose claims are checked")
	fs.StringVar(&daemonSet, "daemonset", os.Getenv(envDaemonSet), "the agents' DaemonSet (namespace/name; default $"+envDaemonSet+"): annotated "+
		app.DeleteSharePodsAnnotation+"=true, it turns --delete-pods on")
	fs.BoolVar(&u.DeletePods, "delete-pods", false, "delete the pods that hold the driver's devices, and wait for their claims to be released")
	fs.DurationVar(&u.Timeout, "timeout", 3*time.Minute, "with --delete-pods, how long to wait for the claims to be released")
	return cmd
}
