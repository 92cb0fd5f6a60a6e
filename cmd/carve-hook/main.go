// Command carve-hook is the container runtime hook that carve's CDI specs
// run: `carve-hook netns-attach --spec FILE`, with the OCI state on stdin,
// moves a NIC share into the container's pod. It is a small static binary
// (built with CGO_ENABLED=0) because it runs on the host, outside carve's
// image: it must not depend on the host's C library, and it starts once per
// container, so it carries only the hook.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/carve-dra/carve/netdev"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "netns-attach" {
		fmt.Fprintln(os.Stderr, "usage: carve-hook netns-attach --spec FILE [--root DIR] < OCI state")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("netns-attach", flag.ContinueOnError)
	spec := fs.String("spec", "", "the share's attach spec, written at prepare time")
	root := fs.String("root", "/", "host root where /proc is found")
	if err := fs.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	if *spec == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "carve-hook netns-attach: --spec FILE is required, and nothing else")
		os.Exit(2)
	}
	if err := netdev.RunAttachHook(*spec, *root, os.Stdin); err != nil {
		fmt.Fprintf(os.Stderr, "carve-hook netns-attach: %v\n", err)
		os.Exit(1)
	}
}
