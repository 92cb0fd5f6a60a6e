package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/netdev"
)

// runHook is run by the container runtime, from the CDI spec of a prepared
// claim, as a createRuntime hook: the OCI state (with the container's pid)
// comes on stdin.
func runHook(_ context.Context, args []string) error {
	if len(args) == 0 || args[0] != "netns-attach" {
		return fmt.Errorf("usage: carve hook netns-attach --spec FILE < OCI state")
	}
	fs := flag.NewFlagSet("hook netns-attach", flag.ContinueOnError)
	specFile := fs.String("spec", "", "the share's attach spec, written at prepare time")
	root := fs.String("root", "/", "host root where /proc is found")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	spec, err := netdev.ReadAttachSpec(*specFile)
	if err != nil {
		return err
	}
	pid, err := netdev.ContainerPID(os.Stdin)
	if err != nil {
		return err
	}
	podNS, err := netdev.PodNetnsOf(*root, pid)
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
	return netdev.AttachToPod(hostNS, podNS, spec)
}
