package acceptance

import (
	"fmt"
	"io"
	"strings"

	"github.com/carve-dra/carve/gpu/memslice"
)

// The MPS probe (TestMPSProbe, `run.sh probe`) measures on a real card
// what a memory slice's enforcement rests on: how large an allocation the
// claim daemon's pinned-memory ceiling lets a client make, what NVML then
// reports for that process (the figure policing compares with the slice),
// and what the claim's MPS server itself holds, which no slice counts.
// What it judges and prints is here, tested without a GPU.

// ProbeStep is the bisection's resolution: the largest allowed allocation
// is found to within it.
const ProbeStep = 64 << 20

// Bisect finds the largest allocation, a multiple of step above lo, that
// try reports allowed, below hi: lo is taken as allowed and hi as refused,
// neither tried. It tries about log2((hi-lo)/step) sizes, and stops at the
// first error.
func Bisect(lo, hi, step uint64, try func(size uint64) (allowed bool, err error)) (uint64, error) {
	for hi-lo > step {
		mid := lo + (hi-lo)/step/2*step
		ok, err := try(mid)
		if err != nil {
			return lo, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// Reading is one NVML figure: Seen is false where NVML did not list it
// (or had no number for it).
type Reading struct {
	Bytes uint64
	Seen  bool
}

func (r Reading) String() string {
	if !r.Seen {
		return "not listed"
	}
	return mib(r.Bytes)
}

func mib(b uint64) string { return fmt.Sprintf("%d MiB", b>>20) }

// ProbeTry is one client of the probe: the allocation it asked for,
// whether MPS allowed it (else the client's error), and, while it held it,
// NVML's figure for its process and for the claim's MPS server.
type ProbeTry struct {
	Alloc   uint64
	Allowed bool
	Err     string
	Client  Reading
	Server  Reading
}

// ProbeResult is what the probe measured on GPU 0.
type ProbeResult struct {
	GPU string
	// Slice is the share's slice, the daemon's ceiling
	// (set_default_device_pinned_mem_limit).
	Slice uint64
	// UID is the clients' uid; Path the pipe directory's host path with
	// each directory's mode, from the state directory down.
	UID  uint32
	Path string
	// Tries in the order made; the largest allowed is Largest (-1: none
	// was allowed).
	Tries   []ProbeTry
	Largest int
	// Server names the claim's MPS server (pid, uid); ServerIdle is its
	// NVML figure once no client is connected.
	Server     string
	ServerIdle Reading
	// Used is the GPU's used memory (NVML's device figure) before the
	// share, with its daemon alone, with the largest allowed client, and
	// with the server left idle.
	Used [4]uint64
}

// Best is the largest allowed try; false where none was allowed.
func (r ProbeResult) Best() (ProbeTry, bool) {
	if r.Largest < 0 || r.Largest >= len(r.Tries) {
		return ProbeTry{}, false
	}
	return r.Tries[r.Largest], true
}

// Context is NVML's figure for the largest allowed client less its
// allocation: what the process holds beyond what it asked (its CUDA
// context); false where either is unknown.
func (r ProbeResult) Context() (uint64, bool) {
	b, ok := r.Best()
	if !ok || !b.Client.Seen || b.Client.Bytes < b.Alloc {
		return 0, false
	}
	return b.Client.Bytes - b.Alloc, true
}

// OverSlice reports whether NVML's figure for the largest allocation MPS
// allows is over the slice: policing, which compares that figure with the
// slice, would kill a process that MPS let through.
func (r ProbeResult) OverSlice() bool {
	b, ok := r.Best()
	return ok && b.Client.Seen && b.Client.Bytes > r.Slice
}

// serverFootprint is the GPU's used memory with the server idle less
// before the share: the server's (and daemon's) cost seen by the device.
func (r ProbeResult) serverFootprint() string {
	if r.Used[3] == 0 || r.Used[3] < r.Used[0] {
		return "-"
	}
	return mib(r.Used[3] - r.Used[0])
}

// Summary is the probe's line for run.sh device's summary.
func (r ProbeResult) Summary() string {
	b, ok := r.Best()
	if !ok {
		return fmt.Sprintf("slice %s: no allocation allowed (uid %d)", mib(r.Slice), r.UID)
	}
	ctx, cok := r.Context()
	c := "-"
	if cok {
		c = mib(ctx)
	}
	over := "no"
	if r.OverSlice() {
		over = "yes"
	}
	return fmt.Sprintf("slice %s, uid %d: largest allowed %s, NVML %s (context %s), over the slice: %s; MPS server %s with a client, %s idle; GPU used with the server idle less before: %s",
		mib(r.Slice), r.UID, mib(b.Alloc), b.Client, c, over, b.Server, r.ServerIdle, r.serverFootprint())
}

// Markdown writes the probe's tables: what was measured, then each try.
func (r ProbeResult) Markdown(w io.Writer) {
	b, ok := r.Best()
	largest, figure, context, over, with := "none allowed", "-", "-", "-", "-"
	if ok {
		largest = fmt.Sprintf("%s (to within %s)", mib(b.Alloc), mib(ProbeStep))
		figure = b.Client.String()
		with = b.Server.String()
		if c, cok := r.Context(); cok {
			context = mib(c)
		}
		over = "no: a process MPS allows stays within its slice in NVML"
		if r.OverSlice() {
			over = fmt.Sprintf("**yes**: %s > %s, policing at the slice would kill a process MPS allows; the agent's --mps-context-reserve (%s) must be at least the difference", figure, mib(r.Slice), mib(memslice.DefaultContextReserve))
		} else if !b.Client.Seen {
			over = "unknown: NVML did not list the client"
		}
	}
	used := func(i int) string {
		if r.Used[i] == 0 {
			return "-"
		}
		return mib(r.Used[i])
	}
	rows := [][2]string{
		{"GPU 0", r.GPU},
		{"slice = the claim daemon's ceiling", mib(r.Slice)},
		{"client", fmt.Sprintf("uid %d, through %s", r.UID, r.Path)},
		{"largest allocation allowed", largest},
		{"NVML's figure for that process", figure},
		{"figure − allocation (context)", context},
		{"figure > slice", over},
		{"MPS server", r.Server},
		{"MPS server's figure, a client connected", with},
		{"MPS server's figure, no client", r.ServerIdle.String()},
		{"GPU used: before the share / daemon alone / largest client / server idle", fmt.Sprintf("%s / %s / %s / %s", used(0), used(1), used(2), used(3))},
		{"GPU used, server idle − before (what no slice counts)", r.serverFootprint()},
	}
	fmt.Fprintln(w, "| measure | value |")
	fmt.Fprintln(w, "|---|---|")
	for _, row := range rows {
		fmt.Fprintf(w, "| %s | %s |\n", row[0], cell(row[1]))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| try | allocation | outcome | NVML client | NVML server |")
	fmt.Fprintln(w, "|---:|---:|---|---:|---:|")
	for i, t := range r.Tries {
		out := "allowed"
		if !t.Allowed {
			out = "refused: " + t.Err
		}
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s |\n", i+1, mib(t.Alloc), cell(out), t.Client, t.Server)
	}
}

// cell keeps a table cell on its row.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
