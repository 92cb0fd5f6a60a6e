package main

import (
	"fmt"
	"io"
	"sort"
	"time"
)

// median of xs (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// summary is the medians of one scheduler at one size.
type summary struct {
	podsPerSec, packing, aligned, used, minimum float64
	cpuMsPerPod                                 float64
	bound, pods                                 int
	runs                                        int
}

func summarize(rs []result) summary {
	var pps, pack, al, used, minimum, cpu []float64
	s := summary{runs: len(rs)}
	for _, r := range rs {
		pps = append(pps, r.podsPerSec)
		if r.cpuPerPod > 0 {
			cpu = append(cpu, float64(r.cpuPerPod)/float64(time.Millisecond))
		}
		used = append(used, float64(r.used))
		minimum = append(minimum, float64(r.min))
		if r.min > 0 {
			pack = append(pack, float64(r.used)/float64(r.min))
		}
		if r.pairs > 0 {
			al = append(al, float64(r.align)/float64(r.pairs))
		}
		s.bound += r.bound
		s.pods += r.pods
	}
	s.podsPerSec, s.packing, s.aligned, s.used, s.minimum = median(pps), median(pack), median(al), median(used), median(minimum)
	s.cpuMsPerPod = median(cpu)
	return s
}

// pairedRatio is the median over runs of carve's pods/s over stock's in the
// same run (the two ran back to back), steadier than the ratio of medians
// on a machine whose load changes.
func pairedRatio(rs []result, nodes int) float64 {
	stock := map[int]float64{}
	for _, r := range rs {
		if r.nodes == nodes && r.label == "stock" {
			stock[r.run] = r.podsPerSec
		}
	}
	var ratios []float64
	for _, r := range rs {
		if s := stock[r.run]; r.nodes == nodes && r.label == "carve" && s > 0 {
			ratios = append(ratios, r.podsPerSec/s)
		}
	}
	return median(ratios)
}

// printTable writes the side-by-side table: per size, each scheduler's
// medians and carve's pods/s ratio to stock's (of the medians, and the
// median of the per-run ratios); then every run.
func printTable(w io.Writer, sizes []int, results []result) {
	fmt.Fprintln(w, "| nodes | scheduler | runs | pods bound | pods/s (median) | ratio to stock: of medians / median per run | scheduler CPU per pod, ms (median; ratio) | devices used / minimum (median) | GPU+NIC pairs aligned (median) |")
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, n := range sizes {
		by := map[string][]result{}
		for _, r := range results {
			if r.nodes == n {
				by[r.label] = append(by[r.label], r)
			}
		}
		stock := summarize(by["stock"])
		for _, label := range []string{"stock", "carve"} {
			s := summarize(by[label])
			ratio, paired := 0.0, 1.0
			if stock.podsPerSec > 0 {
				ratio = s.podsPerSec / stock.podsPerSec
			}
			if label == "carve" {
				paired = pairedRatio(results, n)
			}
			cpuRatio := 0.0
			if stock.cpuMsPerPod > 0 {
				cpuRatio = s.cpuMsPerPod / stock.cpuMsPerPod
			}
			fmt.Fprintf(w, "| %d | %s | %d | %d/%d | %.1f | %.3f / %.3f | %.2f (%.2f) | %.2f (%.0f / %.0f) | %.1f%% |\n",
				n, label, s.runs, s.bound, s.pods, s.podsPerSec, ratio, paired, s.cpuMsPerPod, cpuRatio, s.packing, s.used, s.minimum, 100*s.aligned)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| nodes | run | scheduler | bound | pods/s | CPU per pod, ms | used | minimum | pairs | aligned |")
	fmt.Fprintln(w, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range results {
		fmt.Fprintf(w, "| %d | %d | %s | %d/%d | %.1f | %.2f | %d | %d | %d | %d |\n", r.nodes, r.run, r.label, r.bound, r.pods, r.podsPerSec, float64(r.cpuPerPod)/float64(time.Millisecond), r.used, r.min, r.pairs, r.align)
	}
}
