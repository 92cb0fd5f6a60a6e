package main

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/carve-dra/carve/prepare/hook"
)

// newHookCommand is `carve hook NAME`: the runtime hooks of package hook,
// with the flags hook.Command defines (the same as carve-hook's).
func newHookCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hook",
		Short: "runtime hooks run from carve's CDI specs (netns-attach, resctrl-attach, dmem-limit)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("a hook is required: netns-attach, resctrl-attach or dmem-limit")
		},
	}
	for _, name := range []struct{ name, short string }{
		{"netns-attach", "move a NIC share into the container's pod network namespace (createRuntime hook)"},
		{"resctrl-attach", "move a container's process into an LLC share's resctrl group (createRuntime hook)"},
		{"dmem-limit", "hold a pod to its GPU memory slice through the dmem cgroup controller (createRuntime hook)"},
	} {
		cmd.AddCommand(newHookSubcommand(name.name, name.short))
	}
	return cmd
}

func newHookSubcommand(name, short string) *cobra.Command {
	run, fs, err := hook.Command(name)
	must(err)
	cmd := &cobra.Command{
		Use:   name + " [flags] < OCI state",
		Short: short,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			err := run(cmd.InOrStdin())
			if err == nil || errors.As(err, new(hook.UsageError)) {
				return err
			}
			return failure{err}
		},
	}
	cmd.Flags().AddGoFlagSet(fs)
	return cmd
}
