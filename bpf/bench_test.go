package bpf

import (
	"testing"

	"github.com/carve-dra/carve/bpf/nettest"
)

// BenchmarkClassify measures classify_egress per packet with BPF_PROG_RUN
// on a 64-byte frame: "hit" (the source MAC is a share: lookup, priority and
// per-CPU count) and "miss" (an unknown MAC, what unshaped traffic pays).
// ns/op is the kernel's own average per run.
func BenchmarkClassify(b *testing.B) {
	b.Run("hit", func(b *testing.B) { benchClassify(b, mac1) })
	b.Run("miss", func(b *testing.B) { benchClassify(b, mac2) })
}

func benchClassify(b *testing.B, src []byte) {
	needRoot(b)
	s := openShaper(b, testPinDir(b))
	defer s.Close()
	if err := s.SetShare(Egress, mac1, 0x10010); err != nil {
		b.Fatal(err)
	}
	frame := make([]byte, 64)
	copy(frame[0:6], mac2) // destination
	copy(frame[6:12], src) // source
	frame[12], frame[13] = 0x08, 0x00

	ret, per, err := s.objs.ClassifyEgress.Benchmark(frame, b.N, b.ResetTimer)
	nettest.SkipIfLacks(b, err, nettest.BPF("BPF_PROG_RUN"))
	if int32(ret) != -1 {
		b.Fatalf("returned %d, want TCX_NEXT (-1)", int32(ret))
	}
	b.ReportMetric(float64(per.Nanoseconds()), "ns/op")

	stats, err := s.Stats()
	if err != nil {
		b.Fatal(err)
	}
	if c := stats[Key{MAC: mac1.String(), Dir: Egress}]; string(src) == string(mac1) && c.Packets < uint64(b.N) {
		b.Fatalf("counted %d packets, ran %d", c.Packets, b.N)
	}
}
