package health

import "context"

// FakeSource is a Source that reports what a test sets.
type FakeSource struct{ ch chan Condition }

// NewFakeSource returns a FakeSource.
func NewFakeSource() *FakeSource { return &FakeSource{ch: make(chan Condition, 64)} }

// Set reports c; it blocks while 64 reports wait for Run.
func (f *FakeSource) Set(c Condition) { f.ch <- c }

// Run hands what Set reports to sink until ctx is done.
func (f *FakeSource) Run(ctx context.Context, sink Sink) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case c := <-f.ch:
			sink.Observe(c)
		}
	}
}
