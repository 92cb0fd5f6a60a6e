package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Binary is the control daemon's executable name.
const Binary = "nvidia-cuda-mps-control"

// pidFile is what the control daemon writes in its pipe directory.
const pidFile = "nvidia-cuda-mps-control.pid"

// Daemon is the control daemon of one GPU.
type Daemon struct {
	// Path is the control binary: an absolute path, or a name looked up
	// on PATH.
	Path string
	// Dir holds the daemon's pipe and log directories (Dir/pipe, Dir/log).
	Dir string
	// UUID is the GPU the daemon serves (its CUDA_VISIBLE_DEVICES).
	UUID string
	// Protocol 3 starts an MPS v3 daemon (`-p 3`); 0 the default (v2).
	Protocol int
	// Timeout bounds each command; 10 s when 0.
	Timeout time.Duration
	// ProcRoot is where the daemon's /proc entry is read; /proc when
	// empty.
	ProcRoot string
	// ShmDir, when set, is the tmpfs (MountShm) the daemon and its servers
	// see as /dev/shm, in a mount namespace of their own: the one its
	// clients' containers mount.
	ShmDir string
	// Start starts the daemon's `-d` command, the one place a daemon is
	// started; StartWithShm (in a mount namespace made from this
	// process's) when nil. StartInHostNamespace starts it from the host's
	// instead.
	Start Starter
	// Keep, when set, moves the daemon's processes where they outlive
	// the agent's container (hostcgroup.FromNamespaces): started in its
	// cgroups, they would die with the agent's pod, and every client's
	// CUDA context with them.
	Keep Keeper
	// LibDirs are the driver's library directories, as this process sees
	// them: the daemon's LD_LIBRARY_PATH, so that it and the servers it
	// starts load the driver's libcuda. None where the loader finds the
	// driver's libraries itself (a driver installed at /).
	LibDirs []string
	// Env are more variables for the daemon; none in the agent (the
	// tests' fake daemons are told where to log by them).
	Env []string
	// Capabilities are what the daemon and its servers keep
	// (ParseCapabilities); nil keeps every capability the agent has.
	Capabilities Capabilities
}

// Keeper holds daemons' processes apart from the agent's container.
type Keeper interface {
	// Keep moves pids (a daemon and its servers) there; idempotent.
	Keep(pids ...int) error
	// Release lets go of the place once no daemon is left.
	Release() error
}

// Starter starts cmd (nvidia-cuda-mps-control -d) as opts say.
type Starter func(cmd *exec.Cmd, opts StartOptions) error

// StartOptions say how a daemon starts.
type StartOptions struct {
	// Shm, when not empty, is bound over /dev/shm in a mount namespace
	// of the daemon's own.
	Shm string
	// Capabilities are the only ones the daemon keeps; nil keeps all.
	Capabilities Capabilities
}

// MaxPipeDir is the longest CUDA_MPS_PIPE_DIRECTORY a control daemon
// starts in: it binds <dir>/control_privileged, a unix socket whose path
// must fit sun_path (108 bytes). Measured on an H100 with driver 580: an
// 87-byte directory starts, an 88-byte one exits 1 after "Starting control
// daemon", with nothing on stderr.
const MaxPipeDir = 87

// PipeDir is the daemon's CUDA_MPS_PIPE_DIRECTORY.
func (d Daemon) PipeDir() string { return filepath.Join(d.Dir, "pipe") }

// LogDir is the daemon's CUDA_MPS_LOG_DIRECTORY.
func (d Daemon) LogDir() string { return filepath.Join(d.Dir, "log") }

// systemPath is the daemon's PATH after the control binary's own
// directory.
const systemPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// env is the daemon's whole environment, built rather than inherited: the
// agent image's (its PATH, LD_LIBRARY_PATH, whatever its pod spec sets)
// left the server, which the daemon starts by name, off PATH where the
// driver is not at /, and libcuda unloadable. PATH leads with the control
// binary's directory, where the driver keeps nvidia-cuda-mps-server beside
// it; LD_LIBRARY_PATH is the driver's library directories; then the three
// CUDA_* variables MPS reads, and d.Env.
func (d Daemon) env() []string {
	path := systemPath
	if filepath.IsAbs(d.Path) {
		path = filepath.Dir(d.Path) + ":" + path
	}
	env := []string{"PATH=" + path}
	if len(d.LibDirs) > 0 {
		env = append(env, "LD_LIBRARY_PATH="+strings.Join(d.LibDirs, ":"))
	}
	env = append(env,
		"CUDA_VISIBLE_DEVICES="+d.UUID,
		"CUDA_MPS_PIPE_DIRECTORY="+d.PipeDir(),
		"CUDA_MPS_LOG_DIRECTORY="+d.LogDir(),
	)
	return append(env, d.Env...)
}

func (d Daemon) timeout() time.Duration {
	if d.Timeout > 0 {
		return d.Timeout
	}
	return 10 * time.Second
}

// PID is the running control daemon's PID, from its pid file, and whether
// that process is alive. A stale pid file gives false.
func (d Daemon) PID() (int, bool) {
	b, err := readNoFollow(filepath.Join(d.PipeDir(), pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return pid, false
	}
	// A PID reused by another process is not the daemon: the daemon (and
	// what it forks) carries this pipe directory in its environment.
	env, err := os.ReadFile(filepath.Join(d.procRoot(), strconv.Itoa(pid), "environ"))
	if err != nil || !bytes.Contains(env, []byte("CUDA_MPS_PIPE_DIRECTORY="+d.PipeDir()+"\x00")) {
		return pid, false
	}
	return pid, true
}

// readNoFollow reads a file the daemon wrote, never through a symbolic
// link: a link planted in its place must not make this root process read
// (or, through Ensure's remove, act on) another file. Nor anything but a
// regular file: a FIFO planted there would block the open, and the agent
// with it, for as long as no one writes to it; it is opened non-blocking
// and refused.
func readNoFollow(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	if st, err := f.Stat(); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, st.Mode().Type())
	}
	b := make([]byte, 64) // a PID and a newline
	n, err := f.Read(b)
	if err != nil && n == 0 {
		return nil, err
	}
	return b[:n], nil
}

func (d Daemon) starter() Starter {
	if d.Start != nil {
		return d.Start
	}
	return func(c *exec.Cmd, opts StartOptions) error {
		if opts.Shm == "" && opts.Capabilities == nil {
			return c.Start()
		}
		return StartWithShm(c, opts)
	}
}

func (d Daemon) procRoot() string {
	if d.ProcRoot != "" {
		return d.ProcRoot
	}
	return "/proc"
}

// Ensure starts the daemon unless one is running in its pipe directory and
// answers; a running one (left by an earlier agent) is adopted. It reports
// whether a daemon was started.
func (d Daemon) Ensure(ctx context.Context) (bool, error) {
	if pid, alive := d.PID(); alive {
		if servers, err := d.Servers(ctx); err == nil {
			// Adopted: kept apart as a started one is (one an
			// earlier carve started in its own container is moved
			// now, with its servers).
			return false, d.keep(append(servers, pid))
		}
		// Alive but deaf: stop it, a fresh one takes its place.
		if err := d.Stop(ctx); err != nil {
			return false, fmt.Errorf("MPS daemon of %s does not answer and cannot be stopped: %w", d.UUID, err)
		}
	}
	if n := len(d.PipeDir()); n > MaxPipeDir {
		return false, fmt.Errorf("MPS daemon of %s: pipe directory %s is %d bytes long, over the %d its sockets' paths allow: choose a shorter state directory", d.UUID, d.PipeDir(), n, MaxPipeDir)
	}
	for _, dir := range []string{d.PipeDir(), d.LogDir()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return false, fmt.Errorf("MPS daemon of %s: %w", d.UUID, err)
		}
	}
	_ = os.Remove(filepath.Join(d.PipeDir(), pidFile))
	args := []string{"-d"}
	if d.Protocol != 0 {
		args = append(args, "-p", strconv.Itoa(d.Protocol))
	}
	start := func(c *exec.Cmd) error {
		return d.starter()(c, StartOptions{Shm: d.ShmDir, Capabilities: d.Capabilities})
	}
	if _, err := d.runWith(ctx, start, "", args...); err != nil {
		// -d prints nothing when it fails; its reason is in its log.
		return false, fmt.Errorf("start MPS daemon of %s: %w%s", d.UUID, err, d.logTail())
	}
	// -d returns once it has forked; wait for the daemon to answer.
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, d.timeout(), true, func(ctx context.Context) (bool, error) {
		if _, alive := d.PID(); !alive {
			return false, nil
		}
		_, err := d.Command(ctx, "get_server_list")
		return err == nil, nil
	})
	if err != nil && ctx.Err() == nil {
		return true, fmt.Errorf("MPS daemon of %s started but did not answer within %s (log: %s)", d.UUID, d.timeout(), d.LogDir())
	}
	if err != nil {
		return true, err
	}
	pid, _ := d.PID()
	return true, d.keep([]int{pid})
}

// keep moves the daemon's processes apart from the agent's container.
func (d Daemon) keep(pids []int) error {
	if d.Keep == nil {
		return nil
	}
	if err := d.Keep.Keep(pids...); err != nil {
		return fmt.Errorf("MPS daemon of %s: keep it apart from the agent's container, which it would not outlive (--mps-cgroup): %w", d.UUID, err)
	}
	return nil
}

// logTail is the end of the daemon's control log, for an error message; ""
// where there is none.
func (d Daemon) logTail() string {
	b, err := os.ReadFile(filepath.Join(d.LogDir(), "control.log"))
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	const most = 600
	if len(b) > most {
		b = b[len(b)-most:]
	}
	return " (" + filepath.Join(d.LogDir(), "control.log") + ": " + strings.TrimSpace(string(b)) + ")"
}

// Command sends one command to the daemon and returns its answer.
func (d Daemon) Command(ctx context.Context, cmd string) (string, error) {
	return d.run(ctx, cmd+"\n")
}

func (d Daemon) run(ctx context.Context, stdin string, args ...string) (string, error) {
	return d.runWith(ctx, func(c *exec.Cmd) error { return c.Start() }, stdin, args...)
}

// runWith runs the control binary, started by start.
func (d Daemon) runWith(ctx context.Context, start func(*exec.Cmd) error, stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout())
	defer cancel()
	path := d.Path
	if path == "" {
		path = Binary
	}
	c := exec.CommandContext(ctx, path, args...) //nolint:gosec // G204: the MPS control binary the agent is configured with, and arguments it builds
	c.Env = d.env()
	c.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := start(c)
	if err == nil {
		err = c.Wait()
	}
	if err != nil {
		return "", fmt.Errorf("%s %s%s: %w: %s", path, strings.Join(args, " "), strings.TrimSpace(stdin), err, strings.TrimSpace(errb.String()+out.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// Servers lists the PIDs of the daemon's running MPS servers.
func (d Daemon) Servers(ctx context.Context) ([]int, error) {
	out, err := d.Command(ctx, "get_server_list")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("MPS daemon of %s: server list %q: %w", d.UUID, out, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// SetCeiling sets the pinned device memory limit, the most any one client
// process may allocate: the default for servers to come and the limit of
// those running (which applies to their next clients). Device 0 is the
// daemon's only GPU.
func (d Daemon) SetCeiling(ctx context.Context, bytes uint64) error {
	limit := limitString(bytes)
	if _, err := d.Command(ctx, "set_default_device_pinned_mem_limit 0 "+limit); err != nil {
		return fmt.Errorf("MPS ceiling %s on %s: %w", limit, d.UUID, err)
	}
	servers, err := d.Servers(ctx)
	if err != nil {
		return err
	}
	for _, pid := range servers {
		if _, err := d.Command(ctx, fmt.Sprintf("set_device_pinned_mem_limit %d 0 %s", pid, limit)); err != nil {
			return fmt.Errorf("MPS ceiling %s on %s, server %d: %w", limit, d.UUID, pid, err)
		}
	}
	return nil
}

// limitString writes a byte count in MPS's units, whole MiB rounded down,
// so that a limit never exceeds the slice.
func limitString(bytes uint64) string { return fmt.Sprintf("%dM", bytes>>20) }

// ClientLimit is CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for a client of a GPU's
// daemon. The daemon sees only its GPU (CUDA_VISIBLE_DEVICES), and an MPS
// server shows its clients the daemon's devices, renumbered from 0, so the
// GPU is device 0 to every client of it, whatever else its container holds.
func ClientLimit(bytes uint64) string { return "0=" + limitString(bytes) }

// Stop quits the daemon (and its servers) and waits for it to exit; no
// daemon is success. The pipe and log directories are removed.
func (d Daemon) Stop(ctx context.Context) error {
	pid, alive := d.PID()
	if alive {
		if _, err := d.Command(ctx, "quit"); err != nil {
			// A daemon that cannot be asked is killed.
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, d.timeout(), true, func(context.Context) (bool, error) {
			_, alive := d.PID()
			return !alive, nil
		})
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return fmt.Errorf("MPS daemon of %s (pid %d) still running %s after quit", d.UUID, pid, d.timeout())
		}
	}
	if err := os.RemoveAll(d.Dir); err != nil {
		return fmt.Errorf("remove MPS directories of %s: %w", d.UUID, err)
	}
	return nil
}
