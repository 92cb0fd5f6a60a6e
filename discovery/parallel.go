package discovery

import (
	"runtime"
	"sync"
)

// maxReaders bounds the goroutines that read sysfs at once. Reading is
// system calls (three for each of tens of thousands of files on a large
// node), which run in parallel on as many CPUs as the process has.
const maxReaders = 8

// forEach runs fn for 0..n-1 on up to GOMAXPROCS goroutines (at most
// maxReaders), each taking a contiguous run of indexes. It returns the error
// of the lowest index that failed, so that the error is the same whatever
// the scheduling.
func forEach(n int, fn func(i int) error) error {
	workers := min(runtime.GOMAXPROCS(0), maxReaders, n)
	if workers <= 1 {
		for i := range n {
			if err := fn(i); err != nil {
				return err
			}
		}
		return nil
	}
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := w*n/workers, (w+1)*n/workers
		wg.Go(func() {
			for i := lo; i < hi; i++ {
				if err := fn(i); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
