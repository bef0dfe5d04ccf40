package cli

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestProxySIGTERMPastGraceAnswersEveryRequest: `egret proxy --grace 1ms`
// gets SIGTERM with 200 POSTs in flight that have all reached the upstream
// (which does not answer). Each must get a truthful answer (502,
// Egret-Outcome: ambiguous: it may have run) and its log line before the
// process exits; before, 168 of 200 got a bare EOF and no line.
func TestProxySIGTERMPastGraceAnswersEveryRequest(t *testing.T) {
	const n = 200
	bin := buildEgret(t)
	var arrived atomic.Int64
	all := make(chan struct{})
	hold := make(chan struct{})
	defer close(hold)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if arrived.Add(1) == n {
			close(all)
		}
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	})}
	go up.Serve(ln)
	defer up.Close()

	cmd := exec.Command(bin, "proxy", "--listen", "127.0.0.1:0", "--grace", "1ms")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 4*n)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	addrRe := regexp.MustCompile(`msg="egret proxy listening" addr=(\S+)`)
	var addr string
	for addr == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("egret proxy exited before listening")
			}
			if m := addrRe.FindStringSubmatch(l); m != nil {
				addr = m[1]
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no listening line")
		}
	}
	answers := make(chan string, n)
	for i := range n {
		go func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				answers <- "dial: " + err.Error()
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			fmt.Fprintf(c, "POST http://%s/pay/%d HTTP/1.1\r\nHost: %s\r\nContent-Length: 3\r\n\r\npay", ln.Addr(), i, ln.Addr())
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answers <- "error: " + err.Error()
				return
			}
			io.Copy(io.Discard, resp.Body)
			answers <- fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("Egret-Outcome"))
		}()
	}
	select {
	case <-all:
	case <-time.After(20 * time.Second):
		t.Fatalf("only %d of %d requests reached the upstream", arrived.Load(), n)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	got := map[string]int{}
	for range n {
		got[<-answers]++
	}
	logged := 0
	for l := range lines {
		if strings.Contains(l, "msg=request") && strings.Contains(l, "outcome=ambiguous") {
			logged++
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Logf("egret proxy exit: %v", err)
	}
	if got["502 ambiguous"] != n || logged != n {
		t.Fatalf("answers %v, ambiguous log lines %d; want %d answered 502 ambiguous and logged", got, logged, n)
	}
	t.Logf("SIGTERM past --grace: %d of %d answered 502 ambiguous, %d logged", got["502 ambiguous"], n, logged)
}
