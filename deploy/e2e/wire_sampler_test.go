package e2e

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// wireSampler reads the bytes and packets a link received, every 100 ms:
// the frames that reached the far end of a share's parent. What HTB counts
// is each TCP segment's frame at L2, but a link's rx_bytes counts a GSO
// packet's headers once for all its segments (at 100M a sender's packets
// carry 4-5 segments: rx_bytes read 0.965 of a saturated share's rate, at
// 20M about 1.0); so the sampler takes every packet but its headers to be
// full segments of one bulk TCP/IPv4 flow (MTU 1500, timestamps on: 1448
// bytes of payload, 66 of headers) and counts their frames, l2Bytes.
type wireSampler struct {
	mu sync.Mutex
	// at is when a sample was read: the middle of the netlink call; half
	// the call's time is how far off the reading may be (the kernel read
	// the counter somewhere inside it). slow marks a call that took over
	// 2 ms (the thread was descheduled): too uncertain to divide by.
	at      []time.Time
	half    []time.Duration
	slow    []bool
	bytes   []uint64
	packets []uint64
	limit   float64
	stop    chan struct{}
	stopped chan struct{}
}

// sampleWire samples link in the named network namespace, or in the test
// process's own (the host's) where ns is "".
func sampleWire(t testing.TB, ns, link string, limit float64) *wireSampler {
	t.Helper()
	var h netns.NsHandle
	var err error
	if ns == "" {
		h, err = netns.GetFromPid(os.Getpid())
	} else {
		h, err = netns.GetFromName(ns)
	}
	if err != nil {
		t.Fatal(err)
	}
	nl, err := netlink.NewHandleAt(h)
	h.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := &wireSampler{limit: limit, stop: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(s.stopped)
		defer nl.Close()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			before := time.Now()
			l, err := nl.LinkByName(link)
			after := time.Now()
			if err == nil && l.Attrs().Statistics != nil {
				took := after.Sub(before)
				s.mu.Lock()
				s.at = append(s.at, before.Add(took/2))
				s.half = append(s.half, took/2)
				s.slow = append(s.slow, took > 2*time.Millisecond)
				s.bytes = append(s.bytes, l.Attrs().Statistics.RxBytes)
				s.packets = append(s.packets, l.Attrs().Statistics.RxPackets)
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// Segment sizes the sampler assumes (see wireSampler).
const (
	wireSegmentPayload = 1448
	wireSegmentHeaders = 14 + 20 + 32
)

// l2Bytes is what the frames between samples i and j carried at L2 as HTB
// counts them: their payload, cut into full segments, each with its
// headers.
func (s *wireSampler) l2Bytes(i, j int) float64 {
	payload := float64(s.bytes[j]-s.bytes[i]) - float64(s.packets[j]-s.packets[i])*wireSegmentHeaders
	return max(payload, 0) * (wireSegmentPayload + wireSegmentHeaders) / wireSegmentPayload
}

// over lists the intervals whose rate was over frac of limit, by when they
// ended, relative to t0.
func (s *wireSampler) over(limit, frac float64, t0 time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for i := 1; i < len(s.at); i++ {
		if s.slow[i] || s.slow[i-1] {
			continue
		}
		bps := s.l2Bytes(i-1, i) * 8 / s.at[i].Sub(s.at[i-1]).Seconds()
		if bps > frac*limit {
			// With the two intervals before it: a burst after a lull
			// is the token bucket's, a run of them a leak.
			ctx := ""
			for k := max(i-2, 1); k < i; k++ {
				ctx += fmt.Sprintf("%.3f ", s.l2Bytes(k-1, k)*8/s.at[k].Sub(s.at[k-1]).Seconds()/limit)
			}
			out = append(out, fmt.Sprintf("%.1fs:%.3f (after %s)", s.at[i].Sub(t0).Seconds(), bps/limit, strings.TrimSpace(ctx)))
		}
	}
	return out
}

// wireStats is what the samples say: the highest rate over any one
// interval, and the longest run of intervals with nothing received.
type wireStats struct {
	samples, uncertain int
	// overBurst is the most bytes any stretch between two samples carried
	// beyond 1.01 of the limit, less what the limit carries in the two
	// readings' own uncertainty (half of each netlink call); a token
	// bucket lets out up to its burst after a lull, so conformance is
	// overBurst within the class's burst.
	overBurst float64
	// maxSecond is the highest rate over any stretch of a second or more,
	// less the readings' uncertainty as above.
	maxSecond      float64
	maxBps         float64
	maxAt          time.Time
	longestSilence time.Duration
}

func (s *wireSampler) finish() wireStats {
	close(s.stop)
	<-s.stopped
	s.mu.Lock()
	defer s.mu.Unlock()
	var st wireStats
	st.samples = len(s.at)
	var silentSince time.Time
	for i := 1; i < len(s.at); i++ {
		dt := s.at[i].Sub(s.at[i-1]).Seconds()
		d := s.bytes[i] - s.bytes[i-1]
		if s.slow[i] || s.slow[i-1] {
			st.uncertain++
		} else if bps := s.l2Bytes(i-1, i) * 8 / dt; bps > st.maxBps {
			st.maxBps, st.maxAt = bps, s.at[i]
		}
		if d == 0 {
			if silentSince.IsZero() {
				silentSince = s.at[i-1]
			}
			if gap := s.at[i].Sub(silentSince); gap > st.longestSilence {
				st.longestSilence = gap
			}
		} else {
			silentSince = time.Time{}
		}
	}
	// Every stretch between two trusted samples: what it carried beyond
	// 1.01 of the limit (bytes), and over a second or more its rate.
	for i := 0; i < len(s.at); i++ {
		if s.slow[i] {
			continue
		}
		for j := i + 1; j < len(s.at); j++ {
			if s.slow[j] {
				continue
			}
			dt := s.at[j].Sub(s.at[i]).Seconds()
			got := s.l2Bytes(i, j)
			slack := s.limit / 8 * (s.half[i] + s.half[j]).Seconds()
			if ex := got - 1.01*s.limit/8*dt - slack; ex > st.overBurst {
				st.overBurst = ex
			}
			if dt >= 1 {
				if bps := (got - slack) * 8 / dt; bps > st.maxSecond {
					st.maxSecond = bps
				}
			}
		}
	}
	return st
}

// shareBurstBound is the most a share's class of rateBits can let out
// beyond its rate at once, in bytes at L2: HTB's burst (netdev's
// htbBuffer: 8 ms of the rate, at least 16 KiB), then one more of the
// pod's super-packets, which HTB lets out whole while the class still has
// a token and charges after (netdev/gso.go: about 4 ms of the rate, at
// least 2 segments, of 1514-byte frames). After a TCP timeout's silence the
// class's bucket is full: a CI run read 99,750 bytes beyond 1.01 of a 100M
// share's rate in one 100 ms stretch, against a burst of 100,000.
func shareBurstBound(rateBits float64) int {
	burst := max(int(rateBits/8*8/1000), 16*1024)
	segs := max(int(rateBits/8*4/1000/1500), 2)
	if segs*1500 >= 64<<10 {
		segs = (64<<10)/1448 + 1 // the kernel's own limit, 64 KiB of payload
	}
	return burst + segs*1514
}
