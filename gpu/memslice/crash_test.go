package memslice

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The crash matrix of a claim's daemon: the agent dies at every step of
// set-up and of teardown, beside another claim's share of the GPU. A new
// agent, restored from a checkpoint that holds the share or not (prepare
// had not returned, or the checkpoint was lost), then unprepares; whatever the step, the crashed
// claim's daemon, tmpfs and directories are gone, the other claim's daemon
// runs on, and the GPU's mode comes back after the last share.
func TestCrashAtEveryStepConverges(t *testing.T) {
	prepPoints := []string{"gpushare-mode-held", "gpushare-daemon-recorded", "gpushare-shm-mounted", "gpushare-daemon-started"}
	unprepPoints := []string{"gpushare-daemon-stopped", "gpushare-shm-unmounted", "gpushare-claim-released"}
	ctx := context.Background()
	for _, point := range append(prepPoints, unprepPoints...) {
		for _, checkpointed := range []bool{false, true} {
			name := point
			if checkpointed {
				name += "/checkpointed"
			}
			t.Run(name, func(t *testing.T) {
				e := newEnv(t)
				e.nv.mode = nvml.COMPUTEMODE_EXCLUSIVE_PROCESS
				other, r := share("other", 10*gib, TierMPSPoliced), share("a", 10*gib, TierMPSPoliced)
				first := New(e.opts)
				if _, _, err := first.Prepare(ctx, other); err != nil {
					t.Fatal(err)
				}
				unprep := slices.Contains(unprepPoints, point)
				if checkpointed && !unprep {
					t.Skip("a prepare that did not return is never checkpointed")
				}
				if unprep {
					if _, _, err := first.Prepare(ctx, r); err != nil {
						t.Fatal(err)
					}
				}
				crashAt(t, point)
				returned := run(func() {
					if unprep {
						_ = first.Unprepare(ctx, r.Key, r.UUID)
					} else {
						_, _, _ = first.Prepare(ctx, r)
					}
				})
				if returned {
					t.Fatalf("the fault point %s was never reached", point)
				}
				crashPoint = func(string) {}
				// The next agent: the checkpoint holds other, and a where
				// its prepare had completed before the crash.
				held := []Request{other}
				if checkpointed && unprep {
					held = append(held, r)
				}
				next := New(e.opts)
				if err := next.Restore(ctx, held); err != nil {
					t.Fatalf("restore: %v", err)
				}
				// The driver's rollback of the started claim, or the
				// kubelet's unprepare; of a claim the checkpoint lost
				// during its unprepare, UnprepareClaim (the driver's
				// cleanup of a claim it does not know).
				for _, again := range []string{"", " again"} {
					var err error
					if unprep && !checkpointed {
						err = next.UnprepareClaim(ctx, r.ClaimUID)
					} else {
						err = next.Unprepare(ctx, r.Key, r.UUID)
					}
					if err != nil {
						t.Fatalf("unprepare%s: %v", again, err)
					}
				}
				if _, err := os.Stat(ClaimDir(e.dir, r.ClaimUID)); !os.IsNotExist(err) {
					t.Errorf("the crashed claim's directory is left")
				}
				if _, alive := e.daemonOf("other").PID(); !alive {
					t.Error("the other claim's daemon was stopped")
				}
				if e.nv.mode != nvml.COMPUTEMODE_DEFAULT {
					t.Errorf("mode %d while the other claim's share is on the GPU", e.nv.mode)
				}
				if err := next.Unprepare(ctx, other.Key, ""); err != nil {
					t.Fatal(err)
				}
				assertNothingLeft(t, e)
				if e.nv.mode != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
					t.Errorf("mode %d after the last share, want EXCLUSIVE_PROCESS back", e.nv.mode)
				}
			})
		}
	}
}
