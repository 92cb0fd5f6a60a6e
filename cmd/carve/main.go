package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal starts a clean shutdown; restoring the default
	// handlers then lets a second one kill the process.
	go func() {
		<-ctx.Done()
		stop()
	}()
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// execute runs the command line args and returns the exit status: 0, 1 when
// the command failed, 2 when the command line is wrong.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	logs.FlushLogs()
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), err)
	if errors.As(err, new(failure)) {
		return 1
	}
	fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	return 2
}

func newRootCommand() *cobra.Command {
	logging := logsapi.NewLoggingConfiguration()
	root := &cobra.Command{
		Use:   "carve",
		Short: "carve: NIC shares, FPGAs and LLC ways as Kubernetes DRA devices",
		// Output is this command's alone: errors and usage hints are
		// printed once, by execute.
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return applyLogging(cmd, logging)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Not cobra's Version: its template makes the linker keep
			// every exported method of the binary (TestDeadCode).
			if v, _ := cmd.Flags().GetBool("version"); v {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), buildInfo())
				return err
			}
			return errors.New("a command is required")
		},
	}
	root.Flags().Bool("version", false, "print carve's version (as `carve version`) and exit")
	logsapi.AddFlags(logging, root.PersistentFlags())
	root.AddCommand(newAgentCommand(), newCleanupCommand(), newUninstallCheckCommand(), newDiscoverCommand(), newHookCommand(), newHostMountsCommand(), newSharesCommand(), newSnapshotCommand(), newVersionCommand())
	return root
}

// applyLogging points klog at the format and verbosity the logging flags
// chose, and gives the command's context that logger.
func applyLogging(cmd *cobra.Command, logging *logsapi.LoggingConfiguration) error {
	logs.InitLogs()
	if err := logsapi.ValidateAndApply(logging, nil); err != nil {
		return err
	}
	cmd.SetContext(klog.NewContext(cmd.Context(), klog.Background()))
	return nil
}

// failure marks an error from a command's work, as opposed to one in its
// command line.
type failure struct{ error }

func (f failure) Unwrap() error { return f.error }

// work adapts a command's work to cobra, marking its errors as failures.
func work(run func(cmd *cobra.Command) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		if err := run(cmd); err != nil {
			return failure{err}
		}
		return nil
	}
}

// noArgs refuses positional arguments.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments: %v", args)
	}
	return nil
}

// must panics on an error that only a programming mistake can cause, such as
// marking a flag that was never registered.
func must(err error) {
	if err != nil {
		panic(err)
	}
}
