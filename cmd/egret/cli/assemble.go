package cli

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/urfave/cli/v2"

	"github.com/egret-proxy/egret/proxy"
	"github.com/egret-proxy/egret/proxy/policy"
)

// What egret proxy, egret run and egret agent assemble alike. Each makes
// its proxies of their own parts and of one proxy.Shared for the process:
// sharedSettings reads what the flags say of it, the command adds what it
// has (its metrics, the Services), and proxy.NewShared makes the rest, once
// (egret proxy calls it, agent.New does for egret run and egret agent).

// sharedSettings are the Shared settings the flags of every serving
// command give: --access-log and --log-query.
func sharedSettings(c *cli.Context) (proxy.Shared, error) {
	access, err := accessLog(c)
	if err != nil {
		return proxy.Shared{}, err
	}
	return proxy.Shared{AccessLog: access, LogQuery: c.Bool("log-query")}, nil
}

// newRegistry is the registry of a command that serves /metrics: the Go
// runtime's and the process's collectors, and what the command adds.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// watchPolicy is the policy of --policy, watched (and reloaded on change)
// until ctx ends, and its name for the logs; without --policy, the
// embedded defaults.
func watchPolicy(ctx context.Context, c *cli.Context, log *slog.Logger, reg prometheus.Registerer) (proxy.PolicySource, string, error) {
	f := c.String("policy")
	if f == "" {
		return proxy.StaticPolicy{P: policy.Default()}, "embedded defaults", nil
	}
	w, err := policy.NewWatcher(f, log, reg)
	if err != nil {
		return nil, "", policyFileError(f, err)
	}
	go w.Run(ctx)
	return w, f, nil
}

// descriptors raises the process's descriptor limit and returns the
// account of the descriptors its proxies' clients may take, reserve kept
// for egret itself, and the limit: out of descriptors, a new connection
// is refused at once rather than left in the accept queue.
func descriptors(log *slog.Logger, reserve int) (*proxy.FDs, uint64) {
	nofile, err := raiseNoFile()
	if err != nil {
		log.Warn("cannot raise the file descriptor limit", "limit", nofile, "err", err)
	}
	return proxy.NewFDs(int(min(nofile, 1<<30)), reserve), nofile
}
