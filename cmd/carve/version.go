package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is carve's release, the chart's version and appVersion and the
// image's tag (deploy/chart/carve/Chart.yaml; TestVersionsAgree), kept in
// deploy/CHANGELOG.md. commit and buildDate are set by `make release`
// (-ldflags -X); without them the commit is what the Go toolchain recorded
// of the checkout it built, where it recorded one (not with
// -buildvcs=false).
var (
	version   = "0.1.0"
	commit    = ""
	buildDate = ""
)

// buildInfo is the version line of `carve version` and `carve --version`.
func buildInfo() string {
	rev := commit
	if bi, ok := debug.ReadBuildInfo(); ok && rev == "" {
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if rev != "" && modified {
			rev += "-modified"
		}
	}
	if rev == "" {
		rev = "unknown"
	}
	date := buildDate
	if date == "" {
		date = "unknown"
	}
	return fmt.Sprintf("carve v%s, commit %s, built %s, %s %s/%s", version, rev, date, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print carve's version, the commit it was built from and when",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), buildInfo())
			return err
		},
	}
}
