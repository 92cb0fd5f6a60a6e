package main

import (
	"errors"
	"io"

	"github.com/spf13/cobra"

	"github.com/carve-dra/carve/gpu/dmem"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare/llc/resctrl"
)

func newHookCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hook",
		Short: "runtime hooks run from carve's CDI specs (netns-attach, resctrl-attach, dmem-limit)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("a hook is required: netns-attach, resctrl-attach or dmem-limit")
		},
	}
	cmd.AddCommand(newNetnsAttachCommand(), newResctrlAttachCommand(), newDmemLimitCommand())
	return cmd
}

// newResctrlAttachCommand is run by the container runtime, from the CDI
// spec of an LLC share, as a createRuntime hook: it moves the container's
// process into the share's resctrl group, for runtimes that do not apply
// linux.intelRdt themselves (with one that does, it changes nothing).
func newResctrlAttachCommand() *cobra.Command {
	var dir, group string
	cmd := &cobra.Command{
		Use:   "resctrl-attach --group NAME < OCI state",
		Short: "move a container's process into an LLC share's resctrl group (createRuntime hook)",
		Args:  noArgs,
		RunE: work(func(cmd *cobra.Command) error {
			pid, err := netdev.ContainerPID(cmd.InOrStdin())
			if err != nil {
				return err
			}
			return resctrl.AddTask(resctrl.Dir(dir), group, pid)
		}),
	}
	cmd.Flags().StringVar(&dir, "resctrl", "/sys/fs/resctrl", "where resctrl is mounted")
	cmd.Flags().StringVar(&group, "group", "", "the share's resctrl group")
	must(cmd.MarkFlagRequired("group"))
	return cmd
}

// newNetnsAttachCommand is run by the container runtime, from the CDI spec of
// a prepared claim, as a createRuntime hook: the OCI state (with the
// container's pid) comes on stdin.
func newNetnsAttachCommand() *cobra.Command {
	var specFile, root string
	cmd := &cobra.Command{
		Use:   "netns-attach --spec FILE < OCI state",
		Short: "move a NIC share into the container's pod network namespace (createRuntime hook)",
		Args:  noArgs,
		RunE: work(func(cmd *cobra.Command) error {
			return netnsAttach(specFile, root, cmd.InOrStdin())
		}),
	}
	cmd.Flags().StringVar(&specFile, "spec", "", "the share's attach spec, written at prepare time")
	cmd.Flags().StringVar(&root, "root", "/", "host root where /proc is found")
	must(cmd.MarkFlagFilename("spec", "json"))
	return cmd
}

func netnsAttach(specFile, root string, ociState io.Reader) error {
	return netdev.RunAttachHook(specFile, root, ociState)
}

// newDmemLimitCommand is run by the container runtime, from the CDI spec of
// a GPU memory share on the dmem tier, as a createRuntime hook: it writes
// the share's slice to dmem.max (and dmem.min) of the container's pod
// cgroup, for the GPU's region. The pod cannot write its own limits.
func newDmemLimitCommand() *cobra.Command {
	var root, proc, record string
	var l dmem.Limit
	cmd := &cobra.Command{
		Use:   "dmem-limit --region REGION --max BYTES [--min BYTES] < OCI state",
		Short: "hold a pod to its GPU memory slice through the dmem cgroup controller (createRuntime hook)",
		Args:  noArgs,
		RunE: work(func(cmd *cobra.Command) error {
			return dmem.RunHook(cmd.InOrStdin(), root, proc, l, record)
		}),
	}
	cmd.Flags().StringVar(&root, "cgroup-root", dmem.DefaultRoot, "where cgroup v2 is mounted")
	cmd.Flags().StringVar(&proc, "proc", "/proc", "where the container's process is found")
	cmd.Flags().StringVar(&l.Region, "region", "", "the GPU's dmem region (nvidia/<pci>/vidmem)")
	cmd.Flags().Uint64Var(&l.Max, "max", 0, "the slice in bytes (dmem.max)")
	cmd.Flags().Uint64Var(&l.Min, "min", 0, "the guarantee in bytes (dmem.min); 0 leaves it")
	cmd.Flags().StringVar(&record, "record", "", "directory to record the limited pod cgroup in, for carve shares; empty records nothing")
	must(cmd.MarkFlagRequired("region"))
	must(cmd.MarkFlagRequired("max"))
	return cmd
}
