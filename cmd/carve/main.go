// Command carve is the carve DRA driver: `carve discover` prints the node's
// ResourceSlices, `carve agent` runs the kubelet plugin.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

var commands = map[string]command{
	"discover": {"print this node's ResourceSlices as a v1 List", runDiscover},
	"agent":    {"run the kubelet plugin: publish slices, prepare claims", runAgent},
	"hook":     {"runtime hooks run from carve's CDI specs (netns-attach)", runHook},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal starts a clean shutdown; restoring the default
	// handlers then lets a second one kill the process.
	go func() {
		<-ctx.Done()
		stop()
	}()
	if len(os.Args) < 2 || commands[os.Args[1]].run == nil {
		usage()
		os.Exit(2)
	}
	if err := commands[os.Args[1]].run(ctx, os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "carve %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: carve <command> [flags]\n\ncommands:")
	for _, name := range []string{"agent", "discover", "hook"} {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", name, commands[name].summary)
	}
}
