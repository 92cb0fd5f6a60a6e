package acceptance

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Bound is how long a share may be over its slice and still count as
// held: the policing loop's interval and NVML query, and the driver freeing
// a killed process's memory (gpu/police documents it).
const Bound = 200 * time.Millisecond

// Sample is what a share held at one moment.
type Sample struct {
	At   time.Duration
	Held uint64
}

// Over is the most a share held and the longest run of samples over its
// slice (from the first sample over to the first back under).
func Over(slice uint64, samples []Sample) (most uint64, longest time.Duration) {
	var start time.Duration
	over := false
	for _, s := range samples {
		most = max(most, s.Held)
		switch {
		case s.Held > slice && !over:
			over, start = true, s.At
		case s.Held <= slice && over:
			over = false
			longest = max(longest, s.At-start)
		}
	}
	if over && len(samples) > 0 {
		longest = max(longest, samples[len(samples)-1].At-start)
	}
	return most, longest
}

// Row is one attack's outcome.
type Row struct {
	Attack  string
	Outcome string
	Most    uint64
	OverFor time.Duration
	Passed  bool
}

// Held judges an attack that must be held: refused, or killed within Bound.
func Held(attack string, slice uint64, samples []Sample, refused, killed bool) Row {
	most, over := Over(slice, samples)
	r := Row{Attack: attack, Most: most, OverFor: over}
	switch {
	case over > Bound:
		r.Outcome = fmt.Sprintf("NOT HELD: over its slice for %s (bound %s)", over.Round(time.Millisecond), Bound)
	case refused:
		r.Outcome, r.Passed = "held: allocation refused", true
	case killed:
		r.Outcome, r.Passed = "held: process killed in time", true
	case most <= slice:
		r.Outcome, r.Passed = "held: never over its slice", true
	default:
		r.Outcome = "NOT HELD: over its slice and neither refused nor killed"
	}
	return r
}

// Allowed judges an attack that must succeed within the slice.
func Allowed(attack string, slice uint64, samples []Sample, allocated bool) Row {
	most, over := Over(slice, samples)
	r := Row{Attack: attack, Most: most, OverFor: over, Passed: allocated && over == 0}
	r.Outcome = "allowed"
	if !r.Passed {
		r.Outcome = fmt.Sprintf("FAILED: allocated=%v, over for %s", allocated, over)
	}
	return r
}

// Table prints the rows; it reports whether every row passed and the table
// was written.
func Table(w io.Writer, rows []Row) bool {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTACK\tOUTCOME\tMOST HELD\tOVER FOR")
	all := true
	for _, r := range rows {
		most := "-"
		if r.Most > 0 {
			most = fmt.Sprintf("%d MiB", r.Most>>20)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Attack, r.Outcome, most, r.OverFor.Round(time.Millisecond))
		all = all && r.Passed
	}
	return tw.Flush() == nil && all
}

// Plan lists the rows in the order the run makes them: TestDiscovery,
// TestMIG, TestMPSProbe, TestAcceptance (memory slices), TestAgentAsChart.
func Plan(keepComputeMode, enableMIG bool, tenantUID uint) []string {
	// Default either way: carve sets it while a GPU is shared, since each
	// claim's daemon runs an MPS server and EXCLUSIVE_PROCESS admits one.
	skip := "a process of the 10 GiB share skips MPS (compute mode Default: held only if policing kills it)"
	if keepComputeMode {
		skip = "a process of the 10 GiB share skips MPS (compute mode as found, kept; compute mode Default: held only if policing kills it)"
	}
	mig := "MIG rows only where GPU 0 has MIG on already (-enable-mig not given: its mode is never changed)"
	if enableMIG {
		mig = "MIG rows: MIG turned on for them where it is off, and off again after"
	}
	return []string{
		"discovery: each GPU's uuid, bus id and memory against nvidia-smi --query-gpu",
		mig,
		"MIG: every placement `nvidia-smi mig -lgipp` lists is published once, with the name `-lgip` gives, and nothing else",
		fmt.Sprintf("MIG: each placement prepared; the ctypes CUDA client, as uid %d with the claim's device nodes as its read-only /dev, sees exactly its instance; unprepared, nothing left", tenantUID),
		fmt.Sprintf("MIG: two tenants' instances side by side (two claims, no shared slice), each client as uid %d with its own claim's nodes sees its own only", tenantUID),
		"MIG: every pair of placements: the counters allow exactly the pairs the driver makes",
		fmt.Sprintf("MPS probe: a 4 GiB share of GPU 0 through carve's preparer (its claim daemon's ceiling 4 GiB, the state directory 0711), clients as uid %d through the read-only pipe directory: "+
			"the largest allocation allowed (bisected to 64 MiB) against NVML's figure for the process and the slice; the MPS server's own memory with a client and without", tenantUID),
		"prepare two shares of GPU 0: 10 GiB and 20 GiB (latency)",
		"no /dev/shm across claims: a file of the 10 GiB share's process is not in the 20 GiB share's",
		fmt.Sprintf("the 20 GiB share holds 18.5 GiB and computes throughout, as uid %d (another tenant, its own daemon)", tenantUID),
		"one process allocates 8 GiB in the 10 GiB share (allowed)",
		"one process allocates 12 GiB in the 10 GiB share (held)",
		"one process sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=70G and allocates 12 GiB (held)",
		"two processes hold 8 GiB each in the 10 GiB share (held)",
		skip,
		"the 20 GiB share kept computing through every kill",
		"teardown: no claim's daemon, tmpfs or directory left, compute mode restored",
		"the agent as the chart runs it (chrooted in a root of its binary and libraries, host at /host, state directory shared): prepare 10 GiB, a client's 4 GiB through the MPS server its daemon started (the host's binary), teardown",
	}
}
