package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/egret-proxy/egret/agent/pods"
	"github.com/egret-proxy/egret/bpf"
)

// viaEgret reports whether a request from the pod was answered by egret.
func viaEgret(t *testing.T, p *pod, u string) bool {
	t.Helper()
	r := p.curl(t, u)
	if r.Status != 200 {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	return r.Headers.Get("Egret-Request-Id") != ""
}

func TestPodsComeAndGo(t *testing.T) {
	n := newNode(t, nodeOpts{})
	p := n.addPod(t, "web", podOpts{})
	_, up := startLedger(t, p.host4)
	st := n.waitPod(t, "web", "running")
	if !viaEgret(t, p, url(up, "/")) {
		t.Fatal("not redirected")
	}

	// Update in place: exclude the upstream's port; the pod keeps its
	// listener and the exclusion takes effect.
	if err := n.src.Put(pods.Pod{Name: "web", Cgroup: p.cgroup, Netns: p.ns.Path(),
		Exclude: pods.Exclusions{Ports: []uint16{up.Port()}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !viaEgret(t, p, url(up, "/")) })
	if st2 := n.waitPod(t, "web", "running"); st2.Since != st.Since {
		t.Fatalf("an exclusion change restarted the pod")
	}
	// An excluded CIDR goes direct too.
	if err := n.src.Put(pods.Pod{Name: "web", Cgroup: p.cgroup, Netns: p.ns.Path(),
		Exclude: pods.Exclusions{CIDRs: []netip.Prefix{netip.PrefixFrom(p.host4, 32)}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !viaEgret(t, p, url(up, "/")) })
	if err := n.src.Put(pods.Pod{Name: "web", Cgroup: p.cgroup, Netns: p.ns.Path()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return viaEgret(t, p, url(up, "/")) })

	// A process in a container cgroup below the pod's is redirected too.
	ctr := filepath.Join(p.cgroup, "container")
	if err := os.Mkdir(ctr, 0o755); err != nil {
		t.Fatal(err)
	}
	cf, err := os.Open(ctr)
	if err != nil {
		t.Fatal(err)
	}
	cmd := p.command("curl", "-sS", "-i", url(up, "/"))
	cmd.SysProcAttr.CgroupFD = int(cf.Fd())
	out, err := p.run(t, cmd)
	cf.Close()
	if err != nil {
		t.Fatal(err)
	}
	if r := parseHTTP(t, out); r.Headers.Get("Egret-Request-Id") == "" {
		t.Fatal("a container below the pod's cgroup was not redirected")
	}
	if err := os.Remove(ctr); err != nil {
		t.Fatal(err)
	}

	// The pod goes: links, map entries and listener go with it.
	if err := n.src.Remove("web"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, n, "web")
	if viaEgret(t, p, url(up, "/")) {
		t.Fatal("still redirected after the pod went")
	}
	if ids, _ := n.loader.Pods(); len(ids) != 0 {
		t.Fatalf("pinned pods after removal: %v", ids)
	}
	if _, err := os.Stat(filepath.Join(n.pin, "links", "pod", strconv.FormatUint(st.CgroupID, 10))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pod links still pinned: %v", err)
	}
	podsMap, err := ebpf.LoadPinnedMap(filepath.Join(n.pin, "egret_pods"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer podsMap.Close()
	var pc bpf.EgretPodConfig
	if err := podsMap.Lookup(st.CgroupID, &pc); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("pod config still in egret_pods: %v", err)
	}
	tuples, err := ebpf.LoadPinnedMap(filepath.Join(n.pin, "egret_tuples"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tuples.Close()
	var k bpf.EgretTupleKey
	var v bpf.EgretOrigDst
	for it := tuples.Iterate(); it.Next(&k, &v); {
		if v.CgroupId == st.CgroupID {
			t.Fatalf("tuple of the removed pod left: %+v", k)
		}
	}
	err = p.ns.Do(func() error {
		c, err := net.Dial("tcp", st.Listen[0])
		if err == nil {
			c.Close()
			return errors.New("listener still open")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// It comes back.
	p2spec := pods.Pod{Name: "web", Cgroup: p.cgroup, Netns: p.ns.Path()}
	if err := n.src.Put(p2spec); err != nil {
		t.Fatal(err)
	}
	n.waitPod(t, "web", "running")
	if !viaEgret(t, p, url(up, "/")) {
		t.Fatal("not redirected after the pod came back")
	}
	t.Logf("excluded port and CIDR went direct; a container cgroup below the pod was redirected; pod updated in place, removed (links, egret_pods entry, tuples, listener gone; connects direct), re-added (redirected)")
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met")
}

// A client that connected through egret just before its pod went, and
// sends its request only after the pod's proxy began draining, is served
// by that proxy, not reset: it connected in time and cannot know.
func TestPodRemovedServesConnectedClient(t *testing.T) {
	// The held client may stay silent past the sniff timeout (a loaded
	// machine): its request is then served as HTTP all the same.
	n := newNode(t, nodeOpts{})
	p := n.addPod(t, "web", podOpts{})
	led, up := startLedger(t, p.host4)
	n.waitPod(t, "web", "running")

	held := p.childCmd(t, "held", request{Method: "POST", URL: url(up, "/held"), Body: "once",
		Headers: map[string]string{"Ledger-Id": "held"}})
	in, _ := held.StdinPipe()
	out, _ := held.StdoutPipe()
	held.Stderr = os.Stderr
	if err := p.start(held); err != nil {
		t.Fatal(err)
	}
	lines := json.NewDecoder(out)
	var connected, answer response
	if err := lines.Decode(&connected); err != nil || connected.Err != "" {
		t.Fatalf("held client's connect: %v %+v", err, connected)
	}
	if err := n.src.Remove("web"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, n, "web")
	// Not synchronisation: the client speaks late, while the drain is
	// under way and past the sniff timeout, the case under test.
	time.Sleep(400 * time.Millisecond)
	fmt.Fprintln(in, "go")
	if err := lines.Decode(&answer); err != nil {
		t.Fatal(err)
	}
	in.Close()
	held.Wait()
	if answer.Err != "" || answer.Status != 200 || answer.Headers.Get("Egret-Request-Id") == "" {
		t.Fatalf("request on the connection made before the pod went: %+v", answer)
	}
	if viaEgret(t, p, url(up, "/")) {
		t.Fatal("a new connect still redirected after the pod went")
	}
	if got := led.Executions("held"); got != 1 {
		t.Fatalf("ledger executed the held POST %d times", got)
	}
	t.Logf("connected at %s before the removal, request sent after it: %d via egret (%s)",
		connected.Local, answer.Status, answer.Headers.Get("Egret-Request-Id"))
}
