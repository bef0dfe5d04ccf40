package keeper_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent/keeper"
	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// start runs a keeper on a socket in a fresh directory until the test ends.
func start(t *testing.T) *keeper.Keeper { return startHold(t, 0) }

// startHold is start with the keeper's Hold.
func startHold(t *testing.T, hold time.Duration) *keeper.Keeper {
	t.Helper()
	dir := t.TempDir()
	k, err := keeper.Listen(filepath.Join(dir, "keeper.sock"), nil)
	if err != nil {
		t.Fatal(err)
	}
	k.Hold = hold
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return k
}

// serveAt runs a keeper on sock until the returned stop, which returns
// what Serve returned.
func serveAt(t *testing.T, sock string) (stop func() error) {
	t.Helper()
	k, err := keeper.Listen(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- k.Serve(ctx) }()
	return func() error {
		cancel()
		return <-served
	}
}

func dial(t *testing.T, k *keeper.Keeper) (*keeper.Client, map[string]*os.File) {
	t.Helper()
	c, held, err := keeper.Dial(k.Path(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, held
}

// A connect queued on a listener whose agent died is served by the next
// agent, which gets the listener back from the keeper.
func TestQueuedConnectSurvivesTheAgent(t *testing.T) {
	k := start(t)
	c1, held := dial(t, k)
	if len(held) != 0 {
		t.Fatalf("a fresh keeper handed back %v", held)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := c1.Put("pod-a "+addr, ln.(*net.TCPListener)); err != nil {
		t.Fatal(err)
	}
	if err := c1.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := k.Held(); len(got) != 1 || got[0] != "pod-a "+addr {
		t.Fatalf("held %v", got)
	}
	// The agent dies: its descriptors close.
	ln.Close()
	c1.Close()

	// A client connects meanwhile: queued by the kernel on the kept socket.
	client, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("connect while no agent runs: %v", err)
	}
	defer client.Close()
	if _, err := client.Write([]byte("queued")); err != nil {
		t.Fatal(err)
	}

	// The next agent gets the listener back and serves the connection.
	c2, held := dial(t, k)
	f := held["pod-a "+addr]
	if f == nil || len(held) != 1 {
		t.Fatalf("handed back %v", held)
	}
	ln2, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	if ln2.Addr().String() != addr {
		t.Fatalf("adopted listener at %s, want %s", ln2.Addr(), addr)
	}
	_ = ln2.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	srv, err := ln2.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	buf := make([]byte, 6)
	_ = srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(srv, buf); err != nil || string(buf) != "queued" {
		t.Fatalf("read %q, %v", buf, err)
	}

	// Dropped: the keeper closes its copy.
	if err := c2.Drop("pod-a " + addr); err != nil {
		t.Fatal(err)
	}
	if err := c2.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := k.Held(); len(got) != 0 {
		t.Fatalf("held after Drop: %v", got)
	}
}

// Only listening stream sockets are kept: anything else ends the agent's
// connection, and what was held stays.
func TestRefusesWhatIsNotAListener(t *testing.T) {
	k := start(t)
	c, _ := dial(t, k)
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := c.Put("udp", conn); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(5 * time.Second); err == nil {
		t.Fatal("the keeper answered after being handed a UDP socket")
	}
	if got := k.Held(); len(got) != 0 {
		t.Fatalf("held %v", got)
	}
}

const peerEnv = "EGRET_KEEPER_TEST_PEER"

// The keeper serves only peers of its own uid (SO_PEERCRED); an agent of
// another uid gets nothing, and the one after it gets what was held.
func TestRefusesPeerOfAnotherUID(t *testing.T) {
	testenv.RequireRoot(t)
	k := start(t)
	c, _ := dial(t, k)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := c.Put("kept", ln.(*net.TCPListener)); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	c.Close()
	// Let uid 65534 reach the socket: only its credentials stop it.
	for _, d := range []string{filepath.Dir(filepath.Dir(k.Path())), filepath.Dir(k.Path())} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(k.Path(), 0o666); err != nil {
		t.Fatal(err)
	}
	// The test binary's own directory is root's only: run a copy.
	bin := filepath.Join(t.TempDir(), "keeper.test")
	for _, d := range []string{filepath.Dir(filepath.Dir(bin)), filepath.Dir(bin)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exe, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, exe, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestPeerHelper$", "-test.v")
	cmd.Env = append(os.Environ(), peerEnv+"="+k.Path())
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper as uid 65534: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "refused: got nothing") {
		t.Fatalf("helper as uid 65534 did not report its refusal:\n%s", out)
	}
	_, held := dial(t, k)
	if len(held) != 1 || held["kept"] == nil {
		t.Fatalf("the next agent of the right uid got %v", held)
	}
	for _, f := range held {
		f.Close()
	}
}

// TestPeerHelper runs in a child of TestRefusesPeerOfAnotherUID as another
// uid: the keeper must close its connection without sending anything, and
// Dial must refuse a keeper of another uid.
func TestPeerHelper(t *testing.T) {
	path := os.Getenv(peerEnv)
	if path == "" {
		t.Skip("only run by TestRefusesPeerOfAnotherUID")
	}
	if _, _, err := keeper.Dial(path, 5*time.Second); !errors.Is(err, keeper.ErrPeer) {
		t.Fatalf("Dial of a keeper of another uid = %v, want ErrPeer", err)
	}
	c, err := net.Dial("unixpacket", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if n != 0 || (err != nil && !errors.Is(err, io.EOF)) {
		t.Fatalf("the keeper sent %q (%v) to a peer of another uid", buf[:n], err)
	}
	t.Log("refused: got nothing")
}

// DialWait waits for a keeper that starts after the agent (containers of
// one pod start in any order), and gives up after its timeout.
func TestDialWaitForALateKeeper(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "keeper.sock")
	if _, _, err := keeper.DialWait(sock, 50*time.Millisecond); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("DialWait with no keeper = %v, want ENOENT after the timeout", err)
	}
	type result struct {
		c   *keeper.Client
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, _, err := keeper.DialWait(sock, 30*time.Second)
		done <- result{c, err}
	}()
	defer serveAt(t, sock)()
	r := <-done
	if r.err != nil {
		t.Fatalf("DialWait for a keeper that started later: %v", r.err)
	}
	defer r.c.Close()
	if err := r.c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// When no agent comes within the hold, the keeper closes the listeners:
// a connect queued on one is reset (its client learns at once), and the
// next agent gets nothing back.
func TestHoldEndsResetQueuedConnects(t *testing.T) {
	k := startHold(t, 200*time.Millisecond)
	addr := agentDies(t, k)

	client, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("connect while no agent runs: %v", err)
	}
	defer client.Close()
	if _, err := io.WriteString(client, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// The event: the read ends when the keeper's release resets the
	// queued connection; 10 s is only a bound on a broken keeper.
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	n, err := client.Read(make([]byte, 1))
	if n != 0 || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("queued connect after the hold: read %d, %v; want a reset", n, err)
	}
	t.Logf("reset %v after the read began (hold 200ms)", time.Since(start).Round(time.Millisecond))
	if got := k.Held(); len(got) != 0 {
		t.Fatalf("held after the hold: %v", got)
	}
	_, held := dial(t, k)
	if len(held) != 0 {
		t.Fatalf("the next agent got %v back after the hold", held)
	}
}

// An agent that comes within the hold gets the listeners, and the hold's
// end changes nothing for it.
func TestAgentWithinTheHoldKeepsListeners(t *testing.T) {
	hold := 300 * time.Millisecond
	k := startHold(t, hold)
	agentDies(t, k)
	c2, held := dial(t, k)
	if len(held) != 1 {
		t.Fatalf("the next agent got %v, want the listener", held)
	}
	for _, f := range held {
		f.Close()
	}
	// Past the hold with the agent connected: still held. Sync is the
	// event that the keeper has read everything before it; the time
	// waited is the subject (the hold's timer would have fired).
	time.Sleep(2 * hold) // not synchronisation: the hold's length passing is the test's subject
	if err := c2.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := k.Held(); len(got) != 1 {
		t.Fatalf("held %v past the hold with an agent connected, want the listener", got)
	}
}

// agentDies connects an agent to k, hands it one listener ("pod-a ADDR")
// and ends the agent: its listener and connection close. It returns ADDR.
func agentDies(t *testing.T, k *keeper.Keeper) string {
	t.Helper()
	c, _ := dial(t, k)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := c.Put("pod-a "+addr, ln.(*net.TCPListener)); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	ln.Close()
	c.Close()
	return addr
}

// An agent that starts with its keeper (the two containers of one pod)
// connects as soon as the keeper listens: the keeper's socket appears at
// its path only once it accepts, so DialWait never sees a socket file that
// refuses connects and waits for another to be made. (Made in place, the
// file appeared at bind, before listen: an agent woken by it could dial in
// between, be refused, and wait its whole timeout for a file already
// there. On a real node that was a 30 s crash of the new agent in 2 of 5
// rolling updates.)
func TestDialWaitRacingTheKeepersStart(t *testing.T) {
	for i := 0; i < 300; i++ {
		dir := t.TempDir()
		sock := filepath.Join(dir, "keeper.sock")
		done := make(chan error, 1)
		go func() {
			c, _, err := keeper.DialWait(sock, 5*time.Second)
			if err == nil {
				c.Close()
			}
			done <- err
		}()
		stop := serveAt(t, sock)
		err := <-done
		if serr := stop(); serr != nil {
			t.Errorf("Serve: %v", serr)
		}
		if err != nil {
			t.Fatalf("start %d: DialWait beside a keeper starting: %v", i, err)
		}
	}
}
