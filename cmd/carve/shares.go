package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/carve-dra/carve/cmd/carve/sharelist"
	"github.com/carve-dra/carve/gpu/police"
)

func newSharesCommand() *cobra.Command {
	var stateDir, pinDir, output string
	var interval time.Duration
	var nv nvmlFlags
	cmd := &cobra.Command{
		Use:   "shares",
		Short: "list this node's shares with their rates and whether each is enforced; exits 1 if one is not",
		Long: "List every share prepared on this node from the agent's checkpoint and the classifier's pinned maps " +
			"(no API server needed): claim, share, parent and interface, allocated and measured bandwidth, drops, " +
			"and whether its class, classifier entry and links are all in place; and every GPU memory share: " +
			"GPU, tier, slice, used memory (from NVML now, else the agent's last reading, else unknown, saying why), " +
			"kills so far, each share's device's health and carve's taint on it (from the agent's health file), and whether its MPS daemon runs (mps-policed) or its pods' dmem.max holds the slice (dmem). " +
			"A share that is not enforced makes the command exit 1, so it serves as a node check; so does a state directory without the agent's checkpoint " +
			"(the agent writes one as it starts), which is not the agent's.",
		Args: noArgs,
		PreRunE: func(*cobra.Command, []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %s: want table or json", output)
			}
			return nil
		},
		RunE: work(func(cmd *cobra.Command) error {
			if err := sharelist.CheckStateDir(stateDir); err != nil {
				return err
			}
			gpus := &sharelist.GPUSource{StateDir: stateDir, NVML: func(ctx context.Context) (police.Processes, func(), error) {
				s, reason, err := nv.open(ctx, "/")
				if err != nil {
					return nil, nil, err
				}
				if s == nil {
					return nil, nil, reason
				}
				return s, func() { s.Close(ctx) }, nil
			}}
			rows, err := sharelist.List(cmd.Context(), &sharelist.NICSource{StateDir: stateDir, PinDir: pinDir, Interval: interval}, gpus)
			if err != nil {
				return err
			}
			if err := sharelist.AddHealth(rows, stateDir); err != nil {
				return err
			}
			if err := sharelist.Write(cmd.OutOrStdout(), rows, output); err != nil {
				return err
			}
			if n := sharelist.NotEnforced(rows); n > 0 {
				return fmt.Errorf("%d of %d shares not enforced", n, len(rows))
			}
			return nil
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&stateDir, "state-dir", envOr(envStateDir, defaultStateDir), "the agent's state directory (its checkpoint); default $"+envStateDir+", which the chart sets in the agent's container, else "+defaultStateDir)
	fs.StringVar(&pinDir, "bpf-pin-dir", envOr(envPinDir, defaultPinDir), "where the agent pinned the classifier's maps and links; default $"+envPinDir+", else "+defaultPinDir)
	fs.DurationVar(&interval, "interval", 2*time.Second, "how long to measure each share's rate over")
	fs.StringVarP(&output, "output", "o", "table", "table or json")
	nv.add(fs, false)
	must(cmd.MarkFlagDirname("state-dir"))
	return cmd
}
