package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/egret-proxy/egret/agent/services"
	"log/slog"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/egret-proxy/egret/agent/pods/kube"
	"github.com/egret-proxy/egret/internal/cgroup2"
)

// The agent's Kubernetes mode: its pod source is the node's pods that
// opted in by annotation (agent/pods/kube).
func agentKubeFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "kubernetes", Usage: "take the pods from the Kubernetes API: this node's pods annotated egret.dev/enabled: \"true\" (in-cluster config unless --kubeconfig)"},
		&cli.StringFlag{Name: "kubeconfig", Usage: "kubeconfig `FILE` for --kubernetes instead of the in-cluster config"},
		&cli.StringFlag{Name: "node-name", EnvVars: []string{"NODE_NAME"}, Usage: "this node's `NAME` for --kubernetes (the DaemonSet sets NODE_NAME from spec.nodeName)"},
		&cli.StringFlag{Name: "cgroup-driver", Value: string(kube.DriverAuto), Usage: "the kubelet's cgroup `DRIVER` for --kubernetes: auto, cgroupfs or systemd"},
		&cli.StringFlag{Name: "cgroup-root", Value: cgroup2.Root(), Usage: "`DIR` where cgroup v2 is mounted, under which --kubernetes looks for the pods' cgroups"},
		&cli.StringFlag{Name: "kubelet-cgroup-root", Usage: "the kubelet's --cgroup-root `PATH`, if it has one, for --kubernetes"},
		&cli.StringFlag{Name: "pod-name", EnvVars: []string{"POD_NAME"}, Usage: "the agent's own pod `NAME` for --kubernetes (the DaemonSet sets POD_NAME): on SIGTERM its DaemonSet tells an uninstall (pinned state removed) from a restart (kept)"},
		&cli.StringFlag{Name: "cluster-domain", Value: "cluster.local", Usage: "the cluster's DNS `DOMAIN` for --kubernetes: a Host NAME.NS.svc.DOMAIN names a Service"},
		&cli.StringFlag{Name: "pod-namespace", EnvVars: []string{"POD_NAMESPACE"}, Usage: "the agent's own pod's `NAMESPACE` for --kubernetes (the DaemonSet sets POD_NAMESPACE)"},
	}
}

// checkPodSource refuses anything but exactly one pod source, and
// Kubernetes flags without --kubernetes. Checked before anything needs
// root, so the message is the same for everyone.
func checkPodSource(c *cli.Context) error {
	switch {
	case c.String("pods") != "" && c.Bool("kubernetes"):
		return usage("agent takes one pod source: --pods FILE or --kubernetes, not both")
	case c.String("pods") == "" && !c.Bool("kubernetes"):
		return usage("agent needs a pod source: --pods FILE (a pods file) or --kubernetes (this node's annotated pods)")
	}
	if !c.Bool("kubernetes") {
		for _, f := range []string{"kubeconfig", "cgroup-driver", "kubelet-cgroup-root", "cgroup-root", "cluster-domain"} {
			if c.IsSet(f) {
				return usage("--%s is for --kubernetes", f)
			}
		}
		return nil
	}
	if c.String("node-name") == "" {
		return usage("--kubernetes needs this node's name: --node-name NAME or NODE_NAME (the DaemonSet sets it from the downward API, spec.nodeName)")
	}
	if _, err := kube.ParseDriver(c.String("cgroup-driver")); err != nil {
		return usage("--cgroup-driver must be auto, cgroupfs or systemd")
	}
	return nil
}

// kubeSource is the agent's Kubernetes pod source. onError receives what
// the source reports (set once the agent exists); stop ends the Event
// recorder.
func kubeSource(c *cli.Context, log *slog.Logger, onError func(error)) (src *kube.Source, desc []any, stop func(), install *kube.Install, err error) {
	// client-go logs through klog: into the agent's log instead.
	klog.SetSlogLogger(log.With("component", "client-go"))
	cfg, where, err := restConfig(c.String("kubeconfig"))
	if err != nil {
		return nil, nil, nil, nil, cli.Exit(err.Error(), 2)
	}
	cfg.UserAgent = "egret-agent"
	client, err := kube.NewClient(cfg)
	if err != nil {
		return nil, nil, nil, nil, cli.Exit(fmt.Sprintf("kubernetes client: %v", err), 2)
	}
	node := c.String("node-name")
	rec, stopRec := kube.NewRecorder(client, node)
	src, err = kube.New(kube.Config{
		Client:            client,
		NodeName:          node,
		CgroupRoot:        c.String("cgroup-root"),
		KubeletCgroupRoot: c.String("kubelet-cgroup-root"),
		Driver:            kube.Driver(c.String("cgroup-driver")),
		OnError:           onError,
		Recorder:          rec,
		Logger:            log,
	})
	if err != nil {
		stopRec()
		return nil, nil, nil, nil, cli.Exit(err.Error(), 2)
	}
	// Say at once whether the API server answers; the source keeps trying
	// either way (its pods fail open meanwhile).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	version := "unreachable"
	if body, err := client.Get().AbsPath("/version").DoRaw(ctx); err == nil {
		var v struct{ GitVersion string }
		_ = json.Unmarshal(body, &v)
		version = v.GitVersion
	} else {
		log.Warn("kubernetes API server not answering yet; the agent keeps trying", "server", cfg.Host, "err", err)
	}
	desc = []any{"pods_from", "kubernetes", "node", node, "server", cfg.Host, "config", where, "server_version", version,
		"cgroup_driver", c.String("cgroup-driver")}
	// Uninstall or restart: the agent's DaemonSet says, at SIGTERM.
	if c.String("pod-name") == "" || c.String("pod-namespace") == "" {
		log.Warn("the agent's own pod is not named (POD_NAME, POD_NAMESPACE): it cannot tell an uninstall from a restart and leaves the pinned eBPF state on every stop (--cleanup removes it on every stop)")
		desc = append(desc, "uninstall_detection", "off")
		return src, desc, stopRec, nil, nil
	}
	ictx, icancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer icancel()
	install, err = kube.WatchInstall(ictx, cfg, client, c.String("pod-namespace"), c.String("pod-name"))
	if err != nil {
		// Not fatal: the agent serves its pods; it only cannot tell an
		// uninstall from a restart, and so keeps the pinned state.
		log.Warn("cannot watch the agent's DaemonSet: an uninstall will leave the pinned eBPF state", "err", err)
		desc = append(desc, "uninstall_detection", "off")
		return src, desc, stopRec, nil, nil
	}
	desc = append(desc, "daemonset", install.Namespace+"/"+install.DaemonSet)
	return src, desc, stopRec, install, nil
}

// kubeServices is the node's table of Services and the watcher that fills
// it (one informer for Services, one for EndpointSlices): requests to a
// ClusterIP are attributed to their Service and balanced over its
// endpoints by egret. Until the watcher has synced (an API server not
// answering at start) the table lacks the Services, whose requests go
// through their ClusterIPs as the pods sent them.
func kubeServices(c *cli.Context, log *slog.Logger) (*services.Table, *services.Watcher, error) {
	cfg, _, err := restConfig(c.String("kubeconfig"))
	if err != nil {
		return nil, nil, cli.Exit(err.Error(), 2)
	}
	cfg.UserAgent = "egret-agent"
	cl, err := services.NewClients(cfg)
	if err != nil {
		return nil, nil, cli.Exit(fmt.Sprintf("kubernetes client: %v", err), 2)
	}
	t := services.New(services.Options{ClusterDomain: c.String("cluster-domain"), Logger: log})
	return t, services.NewWatcher(t, cl), nil
}

// restConfig is the in-cluster config, or kubeconfig's if named.
func restConfig(kubeconfig string) (*rest.Config, string, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, "", fmt.Errorf("--kubeconfig %s: %v", kubeconfig, err)
		}
		return cfg, kubeconfig, nil
	}
	cfg, err := rest.InClusterConfig()
	if errors.Is(err, rest.ErrNotInCluster) {
		return nil, "", errors.New("--kubernetes: not running in a pod (KUBERNETES_SERVICE_HOST and _PORT unset); give --kubeconfig FILE")
	}
	if err != nil {
		return nil, "", fmt.Errorf("--kubernetes: in-cluster config: %v", err)
	}
	return cfg, "in-cluster", nil
}
