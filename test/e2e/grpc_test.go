package e2e

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// TestEgretRunGRPC: a real grpc-go client under `egret run`, calling a
// real grpc-go server on this host (test/kubenode/testbin's grpc-call
// and grpc-serve). Calls the policy declares idempotent and that the
// server answers UNAVAILABLE once are retried (egret-attempts 2, each run
// once); calls whose stream the server resets after running them come
// back UNKNOWN with egret-outcome ambiguous, run once, never sent again.
func TestEgretRunGRPC(t *testing.T) {
	testenv.RequireRoot(t)
	nothingLeftByRun(t)
	bin := egretBinary(t)
	dir := t.TempDir()
	testbin := filepath.Join(dir, "testbin")
	if out, err := exec.Command("go", "build", "-o", testbin, "github.com/egret-proxy/egret/test/kubenode/testbin").CombinedOutput(); err != nil {
		t.Fatalf("go build testbin: %v\n%s", err, out)
	}
	grpcAddr, resetAddr := freeLoopback(t), freeLoopback(t)
	record := filepath.Join(dir, "exec")
	srv := exec.Command(testbin, "grpc-serve", "-listen", grpcAddr, "-reset-listen", resetAddr, "-record", record)
	var srvErr bytes.Buffer
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	for _, a := range []string{grpcAddr, resetAddr} {
		testenv.Eventually(t, 10*time.Second, "grpc-serve listening on "+a, func() bool {
			c, err := net.Dial("tcp", a)
			if err == nil {
				c.Close()
			}
			return err == nil
		})
	}
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte("defaults:\n  routes:\n    - {method: POST, path_prefix: /grpc.testing.TestService/, idempotent: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// call runs grpc-call under egret run, with the policy pol ("": the
	// embedded default, where a gRPC call is not idempotent).
	call := func(pol string, args ...string) callResult {
		t.Helper()
		argv := []string{"run", "-q"}
		if pol != "" {
			argv = append(argv, "--policy", pol)
		}
		argv = append(append(argv, "--", testbin, "grpc-call"), args...)
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, argv...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("egret run -- testbin grpc-call %s: %v\n%s\nserver: %s", strings.Join(args, " "), err, stderr.String(), srvErr.String())
		}
		var r callResult
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("grpc-call printed %q: %v", stdout.String(), err)
		}
		return r
	}

	r := call(pol, "-n", "20", "-c", "5", "-fault", "unavailable-once", "-id", "idem", grpcAddr)
	for _, c := range r.Calls {
		if c.Code != "OK" || c.Attempts != "2" || c.RequestID == "" {
			t.Errorf("%s: %s attempts %q request id %q; want OK after 2 attempts", c.ID, c.Code, c.Attempts, c.RequestID)
		}
	}
	r = call("", "-n", "3", "-id", "reset", resetAddr)
	for _, c := range r.Calls {
		if c.Code != "Unknown" || c.Outcome != "ambiguous" || c.Attempts != "1" {
			t.Errorf("%s: %s outcome %q attempts %q; want Unknown, ambiguous, 1", c.ID, c.Code, c.Outcome, c.Attempts)
		}
	}
	ran := executions(t, record)
	for i := range 20 {
		if n := ran["idem-"+strconv.Itoa(i)]; n != 1 {
			t.Errorf("idem-%d ran %d times, want 1", i, n)
		}
	}
	for i := range 3 {
		if n := ran["reset-"+strconv.Itoa(i)]; n != 1 {
			t.Errorf("reset-%d ran %d times, want 1", i, n)
		}
	}
}

// callResult is what testbin grpc-call prints (the fields read here).
type callResult struct {
	Calls []struct {
		ID        string `json:"id"`
		Code      string `json:"code"`
		Attempts  string `json:"attempts"`
		RequestID string `json:"request_id"`
		Outcome   string `json:"outcome"`
	} `json:"calls"`
}

// executions counts the exec-ids grpc-serve recorded in dir (a file of
// lines per server; dir/once holds its first-attempt marks).
func executions(t *testing.T, dir string) map[string]int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ran := map[string]int{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range strings.Fields(string(b)) {
			ran[id]++
		}
	}
	return ran
}

// freeLoopback is a free 127.0.0.1 port, as host:port.
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
