package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// KubectlMain runs the kubectl plugin (`kubectl egret`, the binary
// kubectl-egret on PATH) with args and returns its exit status.
func KubectlMain(args []string) int {
	return run(KubectlApp(), args, os.Stderr)
}

// The DaemonSet's defaults (deploy/kubernetes/daemonset.yaml).
const (
	agentNamespace = "egret-system"
	agentSelector  = "app.kubernetes.io/name=egret,app.kubernetes.io/component=agent"
	agentContainer = "agent"
	agentBinary    = "/egret"
)

// KubectlApp builds the kubectl plugin's command line: it finds the egret
// agent on a node and runs an egret command there with kubectl exec.
func KubectlApp() *cli.App {
	return &cli.App{
		Name:      "kubectl-egret",
		HelpName:  "kubectl egret",
		Usage:     "run an egret command in the egret agent of a pod's node",
		UsageText: "kubectl egret [--node NODE] COMMAND [ARGS...]\nkubectl egret explain -n NAMESPACE POD REQUEST-ID",
		Description: "Finds the egret agent pod on a node (--node, or the node of a pod, or the only\n" +
			"agent of the cluster) and runs `egret COMMAND ARGS...` in its container with kubectl\n" +
			"exec (-it when this is a terminal, so tables and egret top look as they do on the\n" +
			"node). `explain -n NAMESPACE POD REQUEST-ID` asks the agent on POD's node.\n" +
			"The plugin's flags come before COMMAND; what follows COMMAND is egret's.\n\n" +
			"  kubectl egret explain -n shop web-7d9f 8e13ac3b035fce95\n" +
			"  kubectl egret --node worker-1 top\n" +
			"  kubectl egret --pod web-7d9f -n shop observe --follow --pod shop/web-7d9f",
		HideVersion:     true,
		HideHelpCommand: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "node", Usage: "the agent on node `NODE`"},
			&cli.StringFlag{Name: "pod", Usage: "the agent on the node of pod `POD` (in --namespace)"},
			&cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Usage: "`NAMESPACE` of --pod (default: the kubeconfig context's)"},
			&cli.StringFlag{Name: "kubeconfig", EnvVars: []string{"KUBECONFIG"}, Usage: "kubeconfig `FILE` (default: kubectl's)"},
			&cli.StringFlag{Name: "context", Usage: "kubeconfig `CONTEXT`"},
			&cli.StringFlag{Name: "agent-namespace", Value: agentNamespace, Usage: "`NAMESPACE` of the egret DaemonSet"},
			&cli.StringFlag{Name: "agent-selector", Value: agentSelector, Usage: "label `SELECTOR` of the agent pods"},
			&cli.StringFlag{Name: "container", Value: agentContainer, Usage: "the agent's `CONTAINER`"},
			&cli.BoolFlag{Name: "dry-run", Usage: "print the kubectl command instead of running it"},
		},
		Action: runKubectl,
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return usage("%v", err)
		},
	}
}

// errAgent is an agent that cannot be found.
var errAgent = errors.New("no egret agent")

func runKubectl(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) == 0 {
		return usage("which egret command? such as: kubectl egret explain -n NAMESPACE POD REQUEST-ID, kubectl egret --node NODE status")
	}
	ns, pod, node := c.String("namespace"), c.String("pod"), c.String("node")
	// explain -n NS POD ID: the pod says which node; egret gets the id.
	if args[0] == "explain" {
		var err error
		if args, ns, pod, err = explainArgs(args, ns, pod); err != nil {
			return err
		}
	}
	if pod != "" && node != "" {
		return usage("--node and a pod both say where: give one")
	}
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	if k := c.String("kubeconfig"); k != "" {
		loading.ExplicitPath = k
	}
	kc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, &clientcmd.ConfigOverrides{CurrentContext: c.String("context")})
	cfg, err := kc.ClientConfig()
	if err != nil {
		return cli.Exit(fmt.Sprintf("kubeconfig: %v", err), 1)
	}
	if ns == "" {
		if ns, _, err = kc.Namespace(); err != nil || ns == "" {
			ns = "default"
		}
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	ctx, cancel := context.WithTimeout(c.Context, 30*time.Second)
	defer cancel()
	if pod != "" {
		p, err := client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return cli.Exit(fmt.Sprintf("pod %s/%s: %v", ns, pod, err), 1)
		}
		if node = p.Spec.NodeName; node == "" {
			return cli.Exit(fmt.Sprintf("pod %s/%s is not scheduled to a node yet", ns, pod), 1)
		}
	}
	agentNS := c.String("agent-namespace")
	agentPod, err := findAgent(ctx, client, agentNS, c.String("agent-selector"), node)
	var ue *usageError
	if errors.As(err, &ue) {
		return err // several agents: the command line must say which
	}
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	kargs := []string{}
	if k := c.String("kubeconfig"); k != "" {
		kargs = append(kargs, "--kubeconfig", k)
	}
	if x := c.String("context"); x != "" {
		kargs = append(kargs, "--context", x)
	}
	kargs = append(kargs, "exec")
	if isTerminal(c.App.Writer) && isTerminal(os.Stdin) {
		kargs = append(kargs, "-it")
	}
	kargs = append(kargs, "-n", agentNS, agentPod, "-c", c.String("container"), "--", agentBinary)
	kargs = append(kargs, args...)
	if c.Bool("dry-run") {
		fmt.Fprintln(c.App.Writer, shellJoin(append([]string{"kubectl"}, kargs...)))
		return nil
	}
	cmd := exec.CommandContext(c.Context, "kubectl", kargs...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, c.App.Writer, c.App.ErrWriter
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			// egret (or kubectl) said why; its status is ours.
			return cli.Exit("", ee.ExitCode())
		}
		return cli.Exit(fmt.Sprintf("kubectl: %v", err), 1)
	}
	return nil
}

// explainArgs reads `explain [-n NS] [POD] ID`: POD (or --pod) locates the
// node, and egret gets explain with the rest.
func explainArgs(args []string, ns, pod string) ([]string, string, string, error) {
	rest := []string{"explain"}
	var pos []string
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-n" || a == "--namespace":
			if i+1 >= len(args) {
				return nil, "", "", usage("%s needs a NAMESPACE", a)
			}
			ns = args[i+1]
			i++
		case strings.HasPrefix(a, "--namespace="):
			ns = strings.TrimPrefix(a, "--namespace=")
		case strings.HasPrefix(a, "-"):
			rest = append(rest, a) // egret explain's own (-o table, --json)
			if (a == "-o" || a == "--output") && i+1 < len(args) {
				rest = append(rest, args[i+1])
				i++
			}
		default:
			pos = append(pos, a)
		}
	}
	switch len(pos) {
	case 1:
	case 2:
		if pod != "" {
			return nil, "", "", usage("explain: the pod is given twice (%s and --pod %s)", pos[0], pod)
		}
		pod, pos = pos[0], pos[1:]
	default:
		return nil, "", "", usage("explain needs [POD] REQUEST-ID, such as: kubectl egret explain -n shop web-7d9f 8e13ac3b035fce95")
	}
	return append(rest, pos[0]), ns, pod, nil
}

// findAgent returns the running agent pod on node, or, with node "", the
// only agent of the cluster.
func findAgent(ctx context.Context, client kubernetes.Interface, ns, selector, node string) (string, error) {
	opts := metav1.ListOptions{LabelSelector: selector}
	if node != "" {
		opts.FieldSelector = "spec.nodeName=" + node
	}
	list, err := client.CoreV1().Pods(ns).List(ctx, opts)
	if err != nil {
		return "", fmt.Errorf("agent pods in %s: %w", ns, err)
	}
	var running []corev1.Pod
	for _, p := range list.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running = append(running, p)
		}
	}
	where := "in the cluster"
	if node != "" {
		where = "on node " + node
	}
	switch {
	case len(running) == 1:
		return running[0].Name, nil
	case len(running) == 0 && len(list.Items) > 0:
		return "", fmt.Errorf("%w running %s: pod %s is %s", errAgent, where, list.Items[0].Name, list.Items[0].Status.Phase)
	case len(running) == 0:
		return "", fmt.Errorf("%w %s (namespace %s, pods %s): is egret installed there, or the node excluded?", errAgent, where, ns, selector)
	case node != "":
		return "", fmt.Errorf("%d egret agents running %s: %s", len(running), where, podNames(running))
	}
	nodes := map[string]bool{}
	for _, p := range running {
		nodes[p.Spec.NodeName] = true
	}
	names := make([]string, 0, len(nodes))
	for n := range nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	return "", usage("%d egret agents in the cluster: say which with --node NODE (%s) or a pod (--pod POD -n NAMESPACE)", len(running), strings.Join(names, ", "))
}

func podNames(ps []corev1.Pod) string {
	names := make([]string, 0, len(ps))
	for _, p := range ps {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// shellJoin quotes args for a POSIX shell where they need it.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,@+", r))
		}) < 0 {
			q[i] = a
			continue
		}
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
