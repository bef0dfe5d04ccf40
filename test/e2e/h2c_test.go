package e2e

import (
	"bytes"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// TestEgretRunCurlH2C: the issue's first try, `egret run -- curl
// --http2-prior-knowledge`, against the ledger on this host. A GET
// answered 503 once is retried; a POST whose stream is refused is retried
// and runs once; a POST reset after the ledger ran it is answered
// ambiguous, never sent again. curl replays a refused stream by itself,
// so --retry 0 and a fresh curl per call keep its own retries out.
func TestEgretRunCurlH2C(t *testing.T) {
	testenv.RequireRoot(t)
	nothingLeftByRun(t)
	bin := egretBinary(t)
	led, up := startLedgerLoopback(t)
	for _, tc := range []struct {
		id, method, fault string
		status, attempts  int
		executions        int
		outcome           string
	}{
		{"h2-get", "GET", "503; times=1", 200, 2, 2, ""},
		{"h2-refused", "POST", "refused-stream; times=1", 200, 2, 1, ""},
		{"h2-goaway", "POST", "goaway; times=1", 200, 2, 1, ""},
		{"h2-reset", "POST", "reset-after-read; times=1", 502, 1, 1, "ambiguous"},
	} {
		args := []string{"run", "-q", "--", "curl", "-sS", "--http2-prior-knowledge", "--retry", "0", "-o", "/dev/null", "-D", "-",
			"-X", tc.method, "-H", "Ledger-Id: " + tc.id, "-H", "Ledger-Fault: " + tc.fault}
		if tc.method == "POST" {
			args = append(args, "--data-binary", "charge=1")
		}
		args = append(args, url(up, "/pay"))
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: egret run: %v\n%s", tc.id, err, stderr.String())
		}
		proto, status, h := parseHead(t, stdout.String())
		t.Logf("$ sudo egret run -- curl --http2-prior-knowledge -X %s -H 'Ledger-Fault: %s' ...\n%s", tc.method, tc.fault, stdout.String())
		n, _ := strconv.Atoi(h.Get("Egret-Attempts"))
		if proto != "HTTP/2" || status != tc.status || n != tc.attempts || led.Executions(tc.id) != tc.executions ||
			h.Get("Egret-Outcome") != tc.outcome {
			t.Errorf("%s: %s %d attempts %d executions %d outcome %q; want HTTP/2 %d, %d, %d, %q", tc.id, proto, status, n,
				led.Executions(tc.id), h.Get("Egret-Outcome"), tc.status, tc.attempts, tc.executions, tc.outcome)
		}
	}
}

// parseHead reads the head curl -D - prints: "HTTP/2 200" and fields.
func parseHead(t *testing.T, out string) (proto string, status int, h http.Header) {
	t.Helper()
	lines := strings.Split(strings.ReplaceAll(out, "\r\n", "\n"), "\n")
	f := strings.Fields(lines[0])
	if len(f) < 2 {
		t.Fatalf("curl printed %q", out)
	}
	status, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("curl printed %q", out)
	}
	h = http.Header{}
	for _, l := range lines[1:] {
		if k, v, ok := strings.Cut(l, ":"); ok {
			h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
		}
	}
	return f[0], status, h
}
