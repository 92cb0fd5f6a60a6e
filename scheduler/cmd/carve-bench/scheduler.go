package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// scheduler is one of the two schedulers under comparison.
type scheduler struct {
	label  string // "stock" or "carve"
	name   string // its schedulerName
	binary string
	port   int
	// profile is the YAML of its profile, after schedulerName.
	profile string
}

// carveProfile is carve-scheduler's profile as deploy/ ships it, with the
// plugins' weights.
func carveProfile(shareFit, topology int) string {
	return fmt.Sprintf(`  plugins:
    multiPoint:
      enabled:
      - name: ShareFit
        weight: %d
      - name: Topology
        weight: %d
  pluginConfig:
  - name: ShareFit
    args:
      strategy: MostAllocated
`, shareFit, topology)
}

// start writes the scheduler's config under dir and starts it, logging to
// dir/<label>.log. Both schedulers get the same client limits, high enough
// that the API client does not bound throughput.
func (s scheduler) start(ctx context.Context, dir, kubeconfig string) (*proc, error) {
	cfg := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
  qps: 1000
  burst: 2000
leaderElection:
  leaderElect: false
profiles:
- schedulerName: %s
%s`, kubeconfig, s.name, s.profile)
	path := filepath.Join(dir, s.label+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, s.label+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("scheduler log: %w", err)
	}
	cmd := exec.CommandContext(ctx, s.binary,
		"--config="+path,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", s.port),
		"--profiling="+profiling(),
		"--v="+verbosity(),
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	// The scheduler writes the log; this process only hands it the file.
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("start %s: %w", s.binary, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(p.done) }()
	return p, nil
}

// proc is a started scheduler process.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// exited is closed once the process has exited.
func (p *proc) exited() <-chan struct{} { return p.done }

// stop ends the scheduler (SIGTERM, then SIGKILL after 15 s) and waits for it.
func (p *proc) stop() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// profiling turns on the schedulers' /debug/pprof where CARVE_BENCH_PROFILING
// is true, to see where a scheduler spends its time during a run.
func profiling() string {
	if os.Getenv("CARVE_BENCH_PROFILING") == "true" {
		return "true"
	}
	return "false"
}

// verbosity is the schedulers' log level: CARVE_BENCH_VERBOSITY, default 1.
// At 3, carve-scheduler logs every request whose devices differ from what
// its scores assumed.
func verbosity() string {
	if v := os.Getenv("CARVE_BENCH_VERBOSITY"); v != "" {
		return v
	}
	return "1"
}
