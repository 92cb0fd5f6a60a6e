package main

import (
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/prepare/hostmount"
)

func newHostMountsCommand() *cobra.Command {
	var shared []string
	var bpffs, mountNS string
	cmd := &cobra.Command{
		Use:   "host-mounts --shared DIR [--shared DIR ...] [--bpffs DIR]",
		Short: "make the host paths the agent's pod shares with the host shared mounts (the chart's init container)",
		Long: "Runs in the host's mount namespace (--mount-ns; by default that of the process that started this one, " +
			"in a container its runtime's shim, whose runtime checks the mounts, else PID 1's; the pod needs hostPID) and makes each --shared " +
			"directory a shared mount (bind-mounted onto itself where it is not a mount point; left alone where the mount " +
			"holding it is shared already, as under systemd), and mounts bpffs at --bpffs where none is, shared. " +
			"A container runtime refuses a Bidirectional mount of a path whose mount is not shared; this lets the " +
			"chart's defaults run on a host whose / is private. / itself is never changed.",
		Args: noArgs,
		RunE: work(func(cmd *cobra.Command) error {
			logger := klog.FromContext(cmd.Context())
			ns := mountNS
			if ns == "" {
				var err error
				if ns, err = hostmount.RuntimeNamespace(); err != nil {
					return err
				}
			}
			logger.Info("Entering the host's mount namespace", "path", ns)
			return hostmount.InNamespace(ns, func() error {
				for _, dir := range shared {
					did, err := hostmount.EnsureShared(dir)
					if err != nil {
						return err
					}
					logger.Info("Host mount", "path", dir, "done", orNothing(did))
				}
				if bpffs != "" {
					did, err := hostmount.EnsureBPFFS(bpffs)
					if err != nil {
						return err
					}
					logger.Info("Host bpffs", "path", bpffs, "done", orNothing(did))
				}
				return nil
			})
		}),
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&shared, "shared", nil, "a host directory to make a shared mount (repeatable)")
	fs.StringVar(&bpffs, "bpffs", "", "where bpffs must be mounted on the host, shared")
	fs.StringVar(&mountNS, "mount-ns", "", "the host's mount namespace (default: the parent process's, else /proc/1/ns/mnt)")
	return cmd
}

func orNothing(a hostmount.Action) string {
	if a == "" {
		return "nothing (already so)"
	}
	return string(a)
}
