package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"bytes"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/discovery/snapshot"
	"github.com/carve-dra/carve/prepare/atomicfile"
)

type snapshotFlags struct {
	root, configFile, output string
	nvml                     nvmlFlags
}

func newSnapshotCommand() *cobra.Command {
	var f snapshotFlags
	cmd := &cobra.Command{
		Use:   "snapshot -o FILE.tar.gz",
		Short: "capture what discovery reads on this node, to reproduce it elsewhere with discover --from",
		Args:  noArgs,
		RunE: work(func(cmd *cobra.Command) error {
			return runSnapshot(cmd.Context(), f)
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&f.root, "root", "/", "host root to read sysfs and procfs under")
	fs.StringVar(&f.configFile, "config", "", "NodeConfig file to include")
	fs.StringVarP(&f.output, "output", "o", "", "the snapshot file (tar.gz) to write")
	f.nvml.add(fs, true)
	must(cmd.MarkFlagRequired("output"))
	must(cmd.MarkFlagFilename("output", "tar.gz"))
	must(cmd.MarkFlagFilename("config", "yaml", "yml"))
	must(cmd.MarkFlagDirname("root"))
	return cmd
}

func runSnapshot(ctx context.Context, f snapshotFlags) error {
	opts := snapshot.Options{Root: f.root}
	if f.configFile != "" {
		data, err := os.ReadFile(f.configFile)
		if err != nil {
			return fmt.Errorf("node config: %w", err)
		}
		opts.NodeConfig = data
	}
	session, _, err := f.nvml.open(ctx, f.root)
	if err != nil {
		return err
	}
	if session != nil {
		defer session.Close(ctx)
		var inv *nvmlinfo.Inventory
		if inv, err = session.Inventory(ctx); err != nil {
			return fmt.Errorf("NVML inventory: %w", err)
		}
		opts.NVML = inv
	}
	var buf bytes.Buffer
	if err := snapshot.Capture(ctx, &buf, opts); err != nil {
		return err
	}
	return atomicfile.Write(f.output, buf.Bytes(), 0o644)
}
