// Command carve-hook is the container runtime hook that carve's CDI specs
// run, with the OCI state on stdin: `netns-attach` moves a NIC share into
// the container's pod, `resctrl-attach` puts the container in its LLC
// share's resctrl group, `dmem-limit` holds its pod to a GPU memory slice.
// It is a small static binary (built with CGO_ENABLED=0) because it runs on
// the host, outside carve's image: it must not depend on the host's C
// library, and it starts once per container, so it carries only the hooks.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/carve-dra/carve/gpu/dmem"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare/llc/resctrl"
)

const usage = "usage: carve-hook netns-attach|resctrl-attach|dmem-limit [flags] < OCI state"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	name := os.Args[1]
	run, fs, err := hook(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := fs.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "carve-hook %s: unexpected arguments %v\n", name, fs.Args())
		os.Exit(2)
	}
	if err := run(os.Stdin); err != nil {
		fmt.Fprintf(os.Stderr, "carve-hook %s: %v\n", name, err)
		if _, usageErr := err.(usageError); usageErr {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a command line that lacks what the hook needs.
type usageError string

func (e usageError) Error() string { return string(e) }

// hook returns the hook's work and its flags, as `carve hook <name>` has
// them.
func hook(name string) (func(io.Reader) error, *flag.FlagSet, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	switch name {
	case "netns-attach":
		spec := fs.String("spec", "", "the share's attach spec, written at prepare time")
		root := fs.String("root", "/", "host root where /proc is found")
		return func(stdin io.Reader) error {
			if *spec == "" {
				return usageError("--spec FILE is required")
			}
			return netdev.RunAttachHook(*spec, *root, stdin)
		}, fs, nil
	case "resctrl-attach":
		dir := fs.String("resctrl", "/sys/fs/resctrl", "where resctrl is mounted")
		group := fs.String("group", "", "the share's resctrl group")
		return func(stdin io.Reader) error {
			if *group == "" {
				return usageError("--group NAME is required")
			}
			pid, err := netdev.ContainerPID(stdin)
			if err != nil {
				return err
			}
			return resctrl.AddTask(resctrl.Dir(*dir), *group, pid)
		}, fs, nil
	case "dmem-limit":
		var l dmem.Limit
		root := fs.String("cgroup-root", dmem.DefaultRoot, "where cgroup v2 is mounted")
		proc := fs.String("proc", "/proc", "where the container's process is found")
		fs.StringVar(&l.Region, "region", "", "the GPU's dmem region (nvidia/<pci>/vidmem)")
		fs.Uint64Var(&l.Max, "max", 0, "the slice in bytes (dmem.max)")
		fs.Uint64Var(&l.Min, "min", 0, "the guarantee in bytes (dmem.min); 0 leaves it")
		record := fs.String("record", "", "directory to record the limited pod cgroup in, for carve shares; empty records nothing")
		return func(stdin io.Reader) error {
			if l.Region == "" || l.Max == 0 {
				return usageError("--region and --max are required")
			}
			return dmem.RunHook(stdin, *root, *proc, l, *record)
		}, fs, nil
	}
	return nil, nil, fmt.Errorf("carve-hook: no hook %q\n%s", name, usage)
}
