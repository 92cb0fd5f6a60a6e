package main

import (
	"context"
	"flag"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// withLogging registers -v on fs and returns a context whose logger writes
// structured text to stderr at the verbosity parsed into fs.
func withLogging(ctx context.Context, fs *flag.FlagSet) context.Context {
	cfg := textlogger.NewConfig()
	cfg.AddFlags(fs)
	logger := textlogger.NewLogger(cfg)
	klog.SetLoggerWithOptions(logger, klog.ContextualLogger(true))
	return klog.NewContext(ctx, logger)
}
