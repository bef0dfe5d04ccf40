package e2e

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/agent"
	"github.com/egret-proxy/egret/proxy"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// The pods' Go client: this test binary re-executed inside a pod (its
// cgroup and namespace) with EGRET_E2E_CHILD set. It is a plain net/http
// client that knows nothing of egret.
const childEnv = "EGRET_E2E_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	code := m.Run()
	if egretBin != "" {
		os.RemoveAll(filepath.Dir(egretBin))
	}
	os.Exit(code)
}

type request struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
	// Load mode: new connection per request, for Duration and at least
	// Min requests (a loaded machine makes fewer in the time: the window
	// is stretched, not the floor lowered).
	Duration time.Duration `json:"duration"`
	Min      int           `json:"min,omitempty"`
	// Timeout is each load request's (5 s when 0).
	Timeout time.Duration `json:"timeout,omitempty"`
	// Silent and stall modes: Count connections (uploads of Size bytes
	// whose head and first KiB only are sent), held until stdin closes.
	// With Admin (the agent's admin socket) and Pod, the report waits
	// until every connection is settled: answered, reset, or counted by
	// the agent as held (see holdConns); without, it says only what was
	// dialed.
	Count int    `json:"count,omitempty"`
	Size  int    `json:"size,omitempty"`
	Admin string `json:"admin,omitempty"`
	Pod   string `json:"pod,omitempty"`
}

// heldReport is what the silent and stall modes say of their connections.
type heldReport struct {
	Dialed    int            `json:"dialed"`
	DialErrs  int            `json:"dial_errors"`
	Held      int            `json:"held"`  // still open, no answer
	Reset     int            `json:"reset"` // reset or closed by the other end
	Answers   map[string]int `json:"answers,omitempty"`
	FirstErrs []string       `json:"first_errors,omitempty"`
	// Unsettled: the agent's count and the connections' fates never
	// added up to what was dialed (within holdSettle); Usage is the
	// agent's last word on the pod.
	Unsettled bool        `json:"unsettled,omitempty"`
	Usage     proxy.Usage `json:"usage"`
}

// holdSettle bounds how long holdConns waits for its connections to
// settle; a failure deadline, not synchronisation.
const holdSettle = 30 * time.Second

type response struct {
	Status  int         `json:"status"`
	Headers http.Header `json:"headers"`
	Body    string      `json:"body"`
	Err     string      `json:"err,omitempty"`
	Reused  bool        `json:"reused,omitempty"`
	Local   string      `json:"local,omitempty"`
}

// loadSample is one request of the load mode.
type loadSample struct {
	Wall   time.Time     `json:"wall"` // when it started
	At     time.Duration `json:"at"`   // since t0 of the test (set by the test)
	Took   time.Duration `json:"took"`
	Egret  bool          `json:"egret"` // answered through egret
	Status int           `json:"status"`
	Err    string        `json:"err,omitempty"`
	// ConnectErr: the failure happened at connect (the pod could not
	// open a connection), not on an established one.
	ConnectErr bool `json:"connect_err,omitempty"`
}

func child(mode string) int {
	var req request
	if err := json.Unmarshal([]byte(os.Getenv("EGRET_E2E_REQ")), &req); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	enc := json.NewEncoder(os.Stdout)
	switch mode {
	case "bench":
		return benchChild()
	case "echo":
		// A non-HTTP client: a line out, a line back.
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(req.URL, "tcp://"), 5*time.Second)
		if err != nil {
			_ = enc.Encode(response{Err: err.Error()})
			return 0
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "%s\n", req.Body)
		line, err := bufio.NewReader(c).ReadString('\n')
		r := response{Body: line, Local: c.LocalAddr().String()}
		if err != nil {
			r.Err = err.Error()
		}
		_ = enc.Encode(r)
	case "connects":
		// Count connects to req.URL (tcp://host:port), each as a client
		// that writes a line at once and reads the answer: how each
		// ended, counted by what the client saw (connectOutcome).
		seen := map[string]int{}
		for range req.Count {
			seen[connectOutcome(strings.TrimPrefix(req.URL, "tcp://"), req.Body)]++
		}
		_ = enc.Encode(seen)
	case "spread":
		// Count connects as "connects" does, each to another port: the
		// port of req.URL, then the next ones.
		host, port, err := net.SplitHostPort(strings.TrimPrefix(req.URL, "tcp://"))
		first, perr := strconv.Atoi(port)
		if err != nil || perr != nil || first+req.Count > 65536 {
			_ = enc.Encode(map[string]int{"bad url " + req.URL: 1})
			return 0
		}
		seen := map[string]int{}
		for i := range req.Count {
			seen[connectOutcome(net.JoinHostPort(host, strconv.Itoa(first+i)), req.Body)]++
		}
		_ = enc.Encode(seen)
	case "firstbyte":
		// Count rounds of connect, write a line, read the first byte of
		// the answer, close: the total time, and how many failed.
		var res struct {
			Nanos  int64 `json:"nanos"`
			Errors int   `json:"errors"`
		}
		addr := strings.TrimPrefix(req.URL, "tcp://")
		buf := make([]byte, 1)
		start := time.Now()
		for range req.Count {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				res.Errors++
				continue
			}
			if _, err := io.WriteString(c, "ping\n"); err != nil {
				res.Errors++
			} else if _, err := io.ReadFull(c, buf); err != nil {
				res.Errors++
			}
			c.Close()
		}
		res.Nanos = time.Since(start).Nanoseconds()
		_ = enc.Encode(res)
	case "grpc":
		// A gRPC client over h2c (prior knowledge), a new connection per
		// call: Count health checks, each answer or error counted.
		seen := map[string]int{}
		for range max(req.Count, 1) {
			seen[grpcHealth(strings.TrimPrefix(req.URL, "tcp://"))]++
		}
		_ = enc.Encode(seen)
	case "tls":
		// One TLS handshake (any certificate) and a line, then close;
		// the header Server-Name, if any, is the ClientHello's server name.
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp",
			strings.TrimPrefix(req.URL, "tcp://"), &tls.Config{InsecureSkipVerify: true, ServerName: req.Headers["Server-Name"]})
		if err != nil {
			_ = enc.Encode(response{Err: err.Error()})
			return 0
		}
		r := response{Local: c.NetConn().LocalAddr().String(), Body: c.ConnectionState().NegotiatedProtocol}
		c.Close()
		_ = enc.Encode(r)
	case "get":
		tr := &http.Transport{DisableKeepAlives: true}
		_ = enc.Encode(do(&http.Client{Transport: tr, Timeout: 20 * time.Second}, req))
	case "held":
		// Connect, say so on stdout, and send the request only after a
		// line read from stdin: a client caught between its connect and
		// its request by whatever the test does meanwhile.
		sc := bufio.NewScanner(os.Stdin)
		tr := &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				_ = enc.Encode(response{Local: localOf(c), Err: errString(err)})
				if err == nil && !sc.Scan() {
					c.Close()
					return nil, errors.New("stdin closed before the go-ahead")
				}
				return c, err
			}}
		_ = enc.Encode(do(&http.Client{Transport: tr, Timeout: 20 * time.Second}, req))
	case "keepalive":
		// One connection, a request, then another on the same connection
		// after each line read from stdin.
		tr := &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute}
		c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		_ = enc.Encode(do(c, req))
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			_ = enc.Encode(do(c, req))
		}
	case "burst":
		// Count requests at once, each on its own connection; the answers
		// by status and Egret-Outcome (or the error).
		tr := &http.Transport{DisableKeepAlives: true}
		c := &http.Client{Transport: tr, Timeout: time.Minute}
		got := make(chan string, req.Count)
		for i := range req.Count {
			r := req
			r.Headers = map[string]string{}
			for k, v := range req.Headers {
				r.Headers[k] = strings.ReplaceAll(v, "{i}", fmt.Sprint(i))
			}
			go func() {
				resp := do(c, r)
				if resp.Err != "" {
					got <- "error: " + resp.Err
					return
				}
				got <- fmt.Sprintf("%d %s", resp.Status, resp.Headers.Get("Egret-Outcome"))
			}()
		}
		answers := map[string]int{}
		for range req.Count {
			answers[<-got]++
		}
		_ = enc.Encode(answers)
	case "silent", "stall":
		_ = enc.Encode(holdConns(mode, req))
		_, _ = io.Copy(io.Discard, os.Stdin) // hold until the test says
	case "load", "loadstream":
		// load: for req.Duration (or, when it is 0, until stdin closes),
		// then every sample as one JSON array; loadstream: each sample a
		// JSON line as it ends, until stdin closes (the test decides when
		// by what the samples show).
		var samples []loadSample
		start := time.Now()
		stop := make(chan struct{})
		untilStdin := mode == "loadstream" || req.Duration == 0
		if untilStdin {
			go func() {
				_, _ = io.Copy(io.Discard, os.Stdin)
				close(stop)
			}()
		}
		done := func() bool {
			if !untilStdin {
				return time.Since(start) >= req.Duration && len(samples) >= req.Min
			}
			select {
			case <-stop:
				return true
			default:
				return false
			}
		}
		for !done() {
			var connectErr bool
			tr := &http.Transport{
				DisableKeepAlives: true,
				DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
					d := net.Dialer{Timeout: 2 * time.Second}
					c, err := d.DialContext(ctx, network, addr)
					connectErr = err != nil
					return c, err
				},
			}
			c := &http.Client{Transport: tr, Timeout: cmp.Or(req.Timeout, 5*time.Second)}
			t0 := time.Now()
			r := do(c, req)
			sample := loadSample{
				Wall: t0, Took: time.Since(t0), Status: r.Status, Err: r.Err,
				Egret: r.Headers.Get("Egret-Request-Id") != "", ConnectErr: connectErr,
			}
			if mode == "loadstream" {
				_ = enc.Encode(sample)
			} else {
				samples = append(samples, sample)
			}
			// Not synchronisation: the load's pace, a request every
			// ~2 ms plus its own time, as a steady client makes.
			time.Sleep(2 * time.Millisecond)
		}
		if mode == "load" {
			_ = enc.Encode(samples)
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown child mode", mode)
		return 2
	}
	return 0
}

// holdConns opens req.Count connections to req.URL's host and port (each
// redirected to egret) and keeps them: silent, or (stall) with an upload's
// head and its first KiB sent. Each connection's fate is an event read on
// it: an answer, or a reset (or close) by egret. A connection egret holds
// has no event; the agent counts it instead (a silent connection in the
// pod's Usage.Conns, a stalled upload by the Size it reserved of the pod's
// spool bytes). The report is made once answers, resets and the agent's
// count add up to the connections dialed: Held is then those without an
// event.
func holdConns(mode string, req request) heldReport {
	var rep heldReport
	target := strings.TrimPrefix(req.URL, "http://")
	host, _, _ := strings.Cut(target, "/")
	var conns []net.Conn
	for range req.Count {
		c, err := net.DialTimeout("tcp", host, 2*time.Second)
		if err != nil {
			rep.DialErrs++
			if len(rep.FirstErrs) < 3 {
				rep.FirstErrs = append(rep.FirstErrs, err.Error())
			}
			continue
		}
		rep.Dialed++
		if mode == "stall" {
			fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", host, req.Size, strings.Repeat("u", 1024))
		}
		conns = append(conns, c)
	}
	if req.Admin == "" {
		return rep
	}
	// fate is an answer ("200 ", "503 not-sent") or "" for a reset.
	fates := make(chan string, len(conns))
	for _, c := range conns {
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				fates <- ""
				return
			}
			fates <- fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("Egret-Outcome"))
		}()
	}
	// One client for every look, its connection closed at the end: a new
	// client per look leaves an idle connection, a descriptor of the
	// agent's, behind each time, and the agent runs out of them.
	adm := agent.AdminClient(req.Admin)
	defer adm.CloseIdleConnections()
	held := func() int {
		resp, err := adm.Get("http://egret/pods/" + req.Pod)
		if err != nil {
			return -1
		}
		defer resp.Body.Close()
		var st agent.PodStatus
		if json.NewDecoder(resp.Body).Decode(&st) != nil || st.Usage == nil {
			return -1
		}
		rep.Usage = *st.Usage
		if mode == "stall" {
			return int(st.Usage.SpoolBytes / int64(max(req.Size, 1)))
		}
		return int(st.Usage.Conns)
	}
	// The agent's count changes with no event a client could wait on, so
	// it is looked at again after the fates that came meanwhile and,
	// between fates, every 20 ms until holdSettle. (One look per fate
	// took 400 admin requests: under -race, -count=3 and CPU load they
	// outlasted holdSettle.)
	deadline := time.After(holdSettle)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	settled := 0
	record := func(f string) {
		settled++
		if f == "" {
			rep.Reset++
			return
		}
		if rep.Answers == nil {
			rep.Answers = map[string]int{}
		}
		rep.Answers[f]++
	}
	for {
		for more := true; more; {
			select {
			case f := <-fates:
				record(f)
			default:
				more = false
			}
		}
		if held()+settled == len(conns) {
			break
		}
		select {
		case f := <-fates:
			record(f)
		case <-tick.C:
		case <-deadline:
			rep.Unsettled = true
			rep.Held = len(conns) - settled
			return rep
		}
	}
	rep.Held = len(conns) - settled
	return rep
}

func do(c *http.Client, req request) response {
	var body io.Reader
	if req.Body != "" {
		body = strings.NewReader(req.Body)
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	hr, err := http.NewRequest(method, req.URL, body)
	if err != nil {
		return response{Err: err.Error()}
	}
	for k, v := range req.Headers {
		hr.Header.Set(k, v)
	}
	var out response
	hr = hr.WithContext(httptrace.WithClientTrace(hr.Context(), &httptrace.ClientTrace{
		GotConn: func(ci httptrace.GotConnInfo) {
			out.Reused = ci.Reused
			out.Local = ci.Conn.LocalAddr().String()
		},
	}))
	resp, err := c.Do(hr)
	if err != nil {
		out.Err = err.Error()
		return out
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	out.Status, out.Headers, out.Body = resp.StatusCode, resp.Header, string(b)
	if err != nil {
		out.Err = err.Error()
	}
	return out
}

// goClient runs the Go client in the pod and returns its answer.
func (p *pod) goClient(t *testing.T, req request) response {
	t.Helper()
	cmd := p.childCmd(t, "get", req)
	out, err := p.run(t, cmd)
	if err != nil {
		t.Fatal(err)
	}
	var r response
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	return r
}

// childCmd runs this binary as the pod's client in mode; spec, if given,
// replaces req as its input.
func (p *pod) childCmd(t testing.TB, mode string, req request, spec ...any) *exec.Cmd {
	t.Helper()
	b, _ := json.Marshal(req)
	if len(spec) > 0 {
		b, _ = json.Marshal(spec[0])
	}
	cmd := p.command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "EGRET_E2E_REQ="+string(b))
	return cmd
}

// grpcHealth makes one health check over a new h2c connection and names
// the result: the serving status, or the gRPC code and the cause.
func grpcHealth(addr string) string {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "client: " + err.Error()
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		st := status.Convert(err)
		cause := st.Message()
		for _, e := range []string{"connection refused", "connection reset by peer", "EOF", "deadline"} {
			if strings.Contains(cause, e) {
				cause = e
				break
			}
		}
		return st.Code().String() + ": " + cause
	}
	return resp.GetStatus().String()
}

// connectOutcome connects to addr, writes line and reads; it returns what
// the client saw: "connect: <errno>" when the connect failed, else
// "connected, write: <errno or ok>, read: <errno, EOF or data>".
func connectOutcome(addr, line string) string {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "connect: " + errnoOf(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	out := "connected, write: "
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		out += errnoOf(err)
	} else {
		out += "ok"
	}
	out += ", read: "
	if _, err := c.Read(make([]byte, 64)); err != nil {
		out += errnoOf(err)
	} else {
		out += "data"
	}
	return out
}

// errnoOf names err by its errno (or EOF / timeout) when it has one.
func errnoOf(err error) string {
	var en syscall.Errno
	switch {
	case errors.As(err, &en):
		return unix.ErrnoName(en)
	case errors.Is(err, io.EOF):
		return "EOF"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	}
	return err.Error()
}

func localOf(c net.Conn) string {
	if c == nil {
		return ""
	}
	return c.LocalAddr().String()
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
