package nettest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// OnOffShare is one share of an on-and-off run: its one TCP flow, and its
// floor and ceiling in bits/s at L2.
type OnOffShare struct {
	Flow        Flow
	Floor, Ceil float64
}

// OnOffResult is what an on-and-off run saw, over its whole seconds.
type OnOffResult struct {
	// Seconds is how many whole seconds had a share sending throughout.
	Seconds int
	// Under and Over name each second a sending share got less than its
	// floor, or more than its ceiling, within 1%.
	Under, Over []string
	// Jains is Jain's index over excess/floor of the sending shares below
	// their ceilings, for each second in which they filled the link
	// (saturated: each wanted more than it got), sorted.
	Jains []float64
}

// RunOnOff switches each share's flow on (1–6 s) and off (0.5–3 s) at
// random, from a schedule seeded by the share's index, for run, and reads
// what each share's class sent (sent: bytes at L2, a share each, in the
// order given) at each whole second from the start. A second counts as
// sending for a share when its flow ran throughout, past its first 300 ms
// (slow start). link is the NIC's rate in bits/s.
func RunOnOff(shares []OnOffShare, run time.Duration, link float64, sent func() ([]uint64, error)) (OnOffResult, error) {
	start := time.Now()
	secs := int(run / time.Second)
	sending := make([][]bool, len(shares))
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(shares))
	for i, s := range shares {
		sending[i] = make([]bool, secs)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 7)) //nolint:gosec // G404: a schedule repeatable from its seed, no secret
			for time.Since(start) < run-2*time.Second {
				time.Sleep(time.Duration(500+r.IntN(2500)) * time.Millisecond)
				on := time.Duration(1000+r.IntN(5000)) * time.Millisecond
				from := time.Since(start)
				if _, err := RunFlows([]Flow{s.Flow}, 0, on, nil); err != nil {
					errs[i] = err
					return
				}
				to := time.Since(start)
				mu.Lock()
				for sec := int((from + 1300*time.Millisecond) / time.Second); sec+1 <= int(to/time.Second) && sec < secs; sec++ {
					sending[i][sec] = true
				}
				mu.Unlock()
			}
		}()
	}
	var counts [][]uint64
	var readErr error
	for sec := 0; sec <= secs; sec++ {
		time.Sleep(time.Until(start.Add(time.Duration(sec) * time.Second)))
		c, err := sent()
		if err != nil {
			readErr = err
			break
		}
		counts = append(counts, c)
	}
	wg.Wait()
	if err := errors.Join(append(errs, readErr)...); err != nil {
		return OnOffResult{}, err
	}
	var res OnOffResult
	for sec := 0; sec+1 < len(counts) && sec < secs; sec++ {
		var excess []float64
		var sum float64
		busy := 0
		for i, s := range shares {
			got := float64(counts[sec+1][i]-counts[sec][i]) * 8
			sum += got
			if !sending[i][sec] {
				continue
			}
			busy++
			if got < 0.99*s.Floor {
				res.Under = append(res.Under, fmt.Sprintf("s%d share %d: %.1f of floor %.0fM", sec, i, got/1e6, s.Floor/1e6))
			}
			if got > 1.01*s.Ceil {
				res.Over = append(res.Over, fmt.Sprintf("s%d share %d: %.1f over ceiling %.0fM", sec, i, got/1e6, s.Ceil/1e6))
			}
			if got < 0.99*s.Ceil {
				excess = append(excess, (got-s.Floor)/s.Floor)
			}
		}
		if busy > 0 {
			res.Seconds++
		}
		if sum >= 0.95*link && len(excess) >= 2 {
			res.Jains = append(res.Jains, Jain(excess))
		}
	}
	sort.Float64s(res.Jains)
	return res, nil
}

// ClassBytes returns a function that reads what each HTB class of handles
// on dev has sent, in bytes at L2 as HTB counts them, through h (the zero
// Handle: this process's namespace): RunOnOff's sent.
func ClassBytes(h *netlink.Handle, dev netlink.Link, handles []uint32) func() ([]uint64, error) {
	return func() ([]uint64, error) {
		classes, err := h.ClassList(dev, netlink.MakeHandle(1, 0))
		if err != nil {
			return nil, fmt.Errorf("classes of %s: %w", dev.Attrs().Name, err)
		}
		bytes := map[uint32]uint64{}
		for _, c := range classes {
			if st := c.Attrs().Statistics; st != nil && st.Basic != nil {
				bytes[c.Attrs().Handle] = st.Basic.Bytes
			}
		}
		out := make([]uint64, len(handles))
		for i, hd := range handles {
			out[i] = bytes[hd]
		}
		return out, nil
	}
}
