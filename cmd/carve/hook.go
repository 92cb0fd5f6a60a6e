package main

import (
	"errors"
	"io"

	"github.com/spf13/cobra"

	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare/llc/resctrl"
)

func newHookCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hook",
		Short: "runtime hooks run from carve's CDI specs (netns-attach, resctrl-attach)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("a hook is required: netns-attach or resctrl-attach")
		},
	}
	cmd.AddCommand(newNetnsAttachCommand(), newResctrlAttachCommand())
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
