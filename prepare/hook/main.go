package hook

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// Usage is the hook's command line.
const Usage = "usage: carve-hook netns-attach|resctrl-attach|dmem-limit [flags] < OCI state"

// Main runs the hook named by args[0] with the rest as its flags and the OCI
// state on stdin, as both `carve-hook` and `carve hook` do, and returns the
// exit code: 0 done, 1 failed, 2 a command line that lacks what it needs.
func Main(args []string, stdin io.Reader, stderr io.Writer) int {
	if len(args) < 1 {
		fmt.Fprintln(stderr, Usage)
		return 2
	}
	name := args[0]
	run, fs, err := Command(name)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	fs.SetOutput(stderr)
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "carve-hook %s: unexpected arguments %v\n", name, fs.Args())
		return 2
	}
	if err := run(stdin); err != nil {
		fmt.Fprintf(stderr, "carve-hook %s: %v\n", name, err)
		if errors.As(err, new(UsageError)) {
			return 2
		}
		return 1
	}
	return 0
}

// UsageError is a command line that lacks what the hook needs.
type UsageError string

func (e UsageError) Error() string { return string(e) }

// Command returns a hook's work and its flags: the one definition of each
// hook's command line.
func Command(name string) (func(io.Reader) error, *flag.FlagSet, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	switch name {
	case "netns-attach":
		spec := fs.String("spec", "", "the share's attach spec, written at prepare time")
		root := fs.String("root", "/", "host root where /proc is found")
		return func(stdin io.Reader) error {
			if *spec == "" {
				return UsageError("--spec FILE is required")
			}
			return RunAttach(*spec, *root, stdin)
		}, fs, nil
	case "resctrl-attach":
		dir := fs.String("resctrl", "/sys/fs/resctrl", "where resctrl is mounted")
		group := fs.String("group", "", "the share's resctrl group")
		return func(stdin io.Reader) error {
			if *group == "" {
				return UsageError("--group NAME is required")
			}
			pid, err := ContainerPID(stdin)
			if err != nil {
				return err
			}
			return AddResctrlTask(*dir, *group, pid)
		}, fs, nil
	case "dmem-limit":
		var l DmemLimit
		root := fs.String("cgroup-root", DefaultCgroupRoot, "where cgroup v2 is mounted")
		proc := fs.String("proc", "/proc", "where the container's process is found")
		fs.StringVar(&l.Region, "region", "", "the GPU's dmem region (nvidia/<pci>/vidmem)")
		fs.Uint64Var(&l.Max, "max", 0, "the slice in bytes (dmem.max)")
		fs.Uint64Var(&l.Min, "min", 0, "the guarantee in bytes (dmem.min); 0 leaves it")
		record := fs.String("record", "", "directory to record the limited pod cgroup in, for carve shares; empty records nothing")
		return func(stdin io.Reader) error {
			if l.Region == "" || l.Max == 0 {
				return UsageError("--region and --max are required")
			}
			return RunDmemLimit(stdin, *root, *proc, l, *record)
		}, fs, nil
	}
	return nil, nil, fmt.Errorf("carve-hook: no hook %q\n%s", name, Usage)
}
