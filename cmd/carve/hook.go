package main

import (
	"errors"
	"io"

	"github.com/spf13/cobra"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/netdev"
)

func newHookCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hook",
		Short: "runtime hooks run from carve's CDI specs (netns-attach)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("a hook is required: netns-attach")
		},
	}
	cmd.AddCommand(newNetnsAttachCommand())
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
	spec, err := netdev.ReadAttachSpec(specFile)
	if err != nil {
		return err
	}
	pid, err := netdev.ContainerPID(ociState)
	if err != nil {
		return err
	}
	podNS, err := netdev.PodNetnsOf(root, pid)
	if err != nil {
		return err
	}
	defer podNS.Close()
	// The runtime runs hooks in its own (the node's) namespace.
	hostNS, err := netns.Get()
	if err != nil {
		return err
	}
	defer hostNS.Close()
	if err := netdev.AttachToPod(hostNS, podNS, spec); err != nil {
		return err
	}
	return netdev.RecordPodNetns(hostNS, podNS, spec)
}
