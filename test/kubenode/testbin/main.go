// Command testbin is the one program of test/kubenode's images (static,
// no libc): the pod sandbox's pause process, and the clients the tests run
// in pods.
//
//	testbin pause                     sleep until SIGTERM/SIGINT, reaping children
//	testbin get [-X METHOD] [-d BODY] URL [NAME: VALUE]...
//	                                  one request; prints the status line, the headers and the body
//	testbin loop -url URL [-listen :8080] [-interval 20ms] [-timeout 5s] [-post]
//	                                  a new connection per request, forever; counts served
//	                                  at /stats (JSON) and zeroed by /reset; -post: every other
//	                                  request is a POST with a unique Exec-Id, whose answers
//	                                  (status, Egret-Outcome) are in /stats' "posts"
//	testbin get-until-egret URL [NAME: VALUE]...
//	                                  GET URL plainly until egret answers (60 s at most), then get
//	testbin probe-once FILE           exit 1 the first time (creating FILE), 0 after
//	testbin serve [-listen :8080] [-admin :8081] [-record DIR] [-post-delay D] [-abrupt]
//	                                  a backend: 200 "pod NAME" with Served-By: NAME (the pod's
//	                                  hostname) to everything; on -admin, /fail?status=503 makes it
//	                                  answer that status to everything, /heal 200 again, /abrupt
//	                                  sets -abrupt (?post-delay=D sets that too). -record: a request with an Exec-Id header is
//	                                  executed by appending the id to DIR/NAME, before it is
//	                                  answered (after -post-delay for a POST). SIGTERM: stop
//	                                  accepting, finish what is in flight; with -abrupt exit at
//	                                  once, every connection reset
//	testbin sidecar [-listen :15001] [-admin :15020] [-retries 2]
//	                                  a stand-in for a mesh's sidecar proxy: serves the connections
//	                                  the pod's iptables REDIRECT sends it, forwards each request to
//	                                  its original destination (SO_ORIGINAL_DST), retrying a 503 or
//	                                  a failed connect up to -retries times whatever the method (as
//	                                  Istio does by default); answers carry Sidecar-Attempts: N.
//	                                  /stats on -admin (JSON): requests, attempts, and requests by
//	                                  their Ledger-Id header
//	testbin spread -n 300 URL         N GETs, each on a new connection (and a new DNS lookup);
//	                                  prints JSON: answers by Served-By, by status, errors
//	testbin tls [-sni NAME] HOST:PORT one TLS handshake (any certificate), ClientHello server name
//	                                  NAME; exit status 1 and the error when it fails
//	testbin grpc-serve [-listen :50051] [-reset-listen :50052] [-record DIR]
//	                                  grpc-go's server of grpc.testing.TestService (UnaryCall,
//	                                  EmptyCall, StreamingOutputCall), executing each call by its
//	                                  exec-id metadata (fault: unavailable-once answers the first
//	                                  attempt UNAVAILABLE); on -reset-listen an h2c server that
//	                                  reads a request, executes it and resets its stream (grpc.go)
//	testbin grpc-call [-n N] [-c C] [-method unary|stream] [-fault F] [-id P] HOST:PORT
//	                                  N calls, C at a time, on one grpc-go client connection;
//	                                  prints JSON: each call's code, egret-attempts,
//	                                  egret-request-id, egret-outcome, served-by
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testbin pause|get|loop|probe-once ...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "pause":
		pause()
	case "get":
		os.Exit(get(os.Args[2:]))
	case "get-until-egret":
		os.Exit(getUntilEgret(os.Args[2:]))
	case "loop":
		loop(os.Args[2:])
	case "serve":
		serve(os.Args[2:])
	case "spread":
		os.Exit(spread(os.Args[2:]))
	case "sidecar":
		sidecar(os.Args[2:])
	case "tls":
		os.Exit(tlsHandshake(os.Args[2:]))
	case "grpc-serve":
		grpcServe(os.Args[2:])
	case "grpc-call":
		os.Exit(grpcCall(os.Args[2:]))
	case "probe-once":
		if len(os.Args) != 3 {
			os.Exit(2)
		}
		if _, err := os.Stat(os.Args[2]); err == nil {
			os.Exit(0)
		}
		_ = os.WriteFile(os.Args[2], []byte("failed once\n"), 0o644)
		os.Exit(1)
	default:
		fmt.Fprintln(os.Stderr, "testbin: unknown command", os.Args[1])
		os.Exit(2)
	}
}

// tlsHandshake makes one TLS handshake with the server name -sni.
func tlsHandshake(args []string) int {
	fs := flag.NewFlagSet("tls", flag.ContinueOnError)
	sni := fs.String("sni", "", "server name")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: testbin tls [-sni NAME] HOST:PORT")
		return 2
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", fs.Arg(0),
		&tls.Config{ServerName: *sni, InsecureSkipVerify: true})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	c.Close()
	return 0
}

func pause() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range c {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, _ := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 {
				break
			}
		}
	}
}

func get(args []string) int {
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	method := fs.String("X", http.MethodGet, "method")
	data := fs.String("d", "", "body")
	if err := fs.Parse(args); err != nil || fs.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: testbin get [-X METHOD] [-d BODY] URL [NAME: VALUE]...")
		return 2
	}
	var body io.Reader
	if *data != "" {
		body = strings.NewReader(*data)
	}
	req, err := http.NewRequest(*method, fs.Arg(0), body)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for _, h := range fs.Args()[1:] {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			fmt.Fprintln(os.Stderr, "bad header", h)
			return 2
		}
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer resp.Body.Close()
	fmt.Printf("%s %s\n", resp.Proto, resp.Status)
	keys := make([]string, 0, len(resp.Header))
	for k := range resp.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("%s: %s\n", k, strings.Join(resp.Header[k], ", "))
	}
	fmt.Println()
	_, _ = io.Copy(os.Stdout, resp.Body)
	return 0
}

// Stats are loop's counts since the last reset.
type Stats struct {
	Since          time.Time `json:"since"`
	Requests       int       `json:"requests"`
	ViaEgret       int       `json:"via_egret"`
	Direct         int       `json:"direct"`
	FailedConnects int       `json:"failed_connects"`
	FailedRequests int       `json:"failed_requests"`
	Hung           int       `json:"hung"`
	BadStatus      int       `json:"bad_status"`
	// DirectRuns are the stretches of consecutive direct answers, in
	// milliseconds from the first to the last of each (a restart's gap).
	DirectRuns []Run     `json:"direct_runs"`
	Errors     []string  `json:"errors"`
	LastEgret  time.Time `json:"last_egret"`
	// SlowestMS is the longest request, answered or not, in ms.
	SlowestMS float64 `json:"slowest_ms"`
	// Posts are the POSTs' answers (-post); the counts above are then
	// the GETs'.
	Posts *Posts `json:"posts,omitempty"`
}

// Posts are the answers to loop's POSTs.
type Posts struct {
	Requests int `json:"requests"`
	// Answers counts them by answer: the status, with egret's
	// Egret-Outcome after it when there is one ("502 ambiguous"), or
	// "error" when no answer came.
	Answers map[string]int `json:"answers"`
	// ByID is each POST's answer, by its Exec-Id.
	ByID map[string]string `json:"by_id"`
	// Errors are the first transport errors.
	Errors []string `json:"errors"`
	// SlowestMS is the longest POST, answered or not, in ms.
	SlowestMS float64 `json:"slowest_ms"`
}

func newPosts() *Posts { return &Posts{Answers: map[string]int{}, ByID: map[string]string{}} }

// Run is one stretch of direct answers.
type Run struct {
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Requests int       `json:"requests"`
	// Gap is from the last answer through egret before the run to the
	// first one after it, in milliseconds (0 while the run lasts).
	GapMS float64 `json:"gap_ms"`
}

func loop(args []string) {
	fs := flag.NewFlagSet("loop", flag.ExitOnError)
	url := fs.String("url", "", "the URL to GET")
	listen := fs.String("listen", ":8080", "where /stats and /reset are served")
	interval := fs.Duration("interval", 20*time.Millisecond, "pause between requests")
	timeout := fs.Duration("timeout", 5*time.Second, "a request longer than this is hung")
	post := fs.Bool("post", false, "every other request is a POST with a unique Exec-Id")
	_ = fs.Parse(args)
	var mu sync.Mutex
	st := Stats{Since: time.Now()}
	if *post {
		st.Posts = newPosts()
	}
	host, _ := os.Hostname()
	var cur *Run
	var lastEgret time.Time
	http.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		out := st
		out.DirectRuns = append([]Run(nil), st.DirectRuns...)
		if cur != nil {
			out.DirectRuns = append(out.DirectRuns, *cur)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	http.HandleFunc("/reset", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		st = Stats{Since: time.Now()}
		if *post {
			st.Posts = newPosts()
		}
		cur = nil
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() { _ = http.Serve(ln, nil) }()

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for n := 0; ; n++ {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		if *post && n%2 == 1 {
			id := host + "-" + strconv.Itoa(n)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, *url, strings.NewReader("post "+id))
			req.Header.Set("Exec-Id", id)
			sent := time.Now()
			resp, err := client.Do(req)
			answer := "error"
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answer = strconv.Itoa(resp.StatusCode)
				if o := resp.Header.Get("Egret-Outcome"); o != "" {
					answer += " " + o
				}
			}
			mu.Lock()
			p := st.Posts
			p.Requests++
			p.Answers[answer]++
			p.ByID[id] = answer
			p.SlowestMS = max(p.SlowestMS, float64(time.Since(sent).Microseconds())/1000)
			if err != nil && len(p.Errors) < 20 {
				p.Errors = append(p.Errors, time.Now().Format(time.RFC3339Nano)+" "+id+" "+err.Error())
			}
			mu.Unlock()
			cancel()
			time.Sleep(*interval)
			continue
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
		req.Header.Set("Ledger-Id", "loop-"+strconv.Itoa(os.Getpid())+"-"+strconv.Itoa(n))
		sent := time.Now()
		resp, err := client.Do(req)
		now := time.Now()
		mu.Lock()
		st.Requests++
		st.SlowestMS = max(st.SlowestMS, float64(now.Sub(sent).Microseconds())/1000)
		switch {
		case err != nil:
			var op *net.OpError
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				st.Hung++
			case errors.As(err, &op) && op.Op == "dial":
				st.FailedConnects++
			default:
				st.FailedRequests++
			}
			if len(st.Errors) < 20 {
				st.Errors = append(st.Errors, now.Format(time.RFC3339Nano)+" "+err.Error())
			}
		case resp.Header.Get("Egret-Attempts") != "":
			st.ViaEgret++
			if cur != nil {
				cur.GapMS = float64(now.Sub(lastEgret).Microseconds()) / 1000
				st.DirectRuns = append(st.DirectRuns, *cur)
				cur = nil
			}
			lastEgret = now
			st.LastEgret = now
		default:
			st.Direct++
			if cur == nil {
				cur = &Run{Start: now}
			}
			cur.End = now
			cur.Requests++
		}
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				st.BadStatus++
			}
		}
		mu.Unlock()
		cancel()
		time.Sleep(*interval)
	}
}

// getUntilEgret waits (asking without the headers, so that no fault is
// spent) until the pod's connects reach egret, then does get.
func getUntilEgret(args []string) int {
	if len(args) < 1 {
		return 2
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(60 * time.Second)
	for n := 0; ; n++ {
		req, _ := http.NewRequest(http.MethodGet, args[0], nil)
		req.Header.Set("Ledger-Id", fmt.Sprintf("until-egret-%d-%d", os.Getpid(), n))
		resp, err := c.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.Header.Get("Egret-Attempts") != "" {
				fmt.Printf("egret answered after %d plain requests\n", n+1)
				return get(args)
			}
		}
		if time.Now().After(deadline) {
			fmt.Println("ERROR egret never answered")
			return 1
		}
		time.Sleep(100 * time.Millisecond) // pacing, not synchronisation: the agent is not ours to wait on
	}
}

// serve is a backend that says which pod answered.
func serve(args []string) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", ":8080", "where requests are answered")
	admin := fs.String("admin", ":8081", "where /fail, /heal and /abrupt are served")
	record := fs.String("record", "", "directory: a request with Exec-Id appends the id to DIR/HOSTNAME (its execution)")
	postDelay := fs.Duration("post-delay", 0, "a POST is answered this long after its execution")
	abruptFlag := fs.Bool("abrupt", false, "on SIGTERM exit at once, resetting every connection")
	_ = fs.Parse(args)
	name, _ := os.Hostname()
	var abrupt atomic.Bool
	abrupt.Store(*abruptFlag)
	var delay atomic.Int64
	delay.Store(int64(*postDelay))
	var ledger *os.File
	if *record != "" {
		f, err := os.OpenFile(filepath.Join(*record, name), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		ledger = f
	}
	var mu sync.Mutex
	status := http.StatusOK
	conns := map[net.Conn]struct{}{}
	am := http.NewServeMux()
	am.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.URL.Query().Get("status"))
		if err != nil || code < 200 || code > 599 {
			http.Error(w, "status=NNN", http.StatusBadRequest)
			return
		}
		mu.Lock()
		status = code
		mu.Unlock()
	})
	am.HandleFunc("/heal", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		status = http.StatusOK
		mu.Unlock()
	})
	am.HandleFunc("/abrupt", func(w http.ResponseWriter, r *http.Request) {
		if v := r.URL.Query().Get("post-delay"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			delay.Store(int64(d))
		}
		abrupt.Store(true)
	})
	go func() { fmt.Fprintln(os.Stderr, http.ListenAndServe(*admin, am)); os.Exit(1) }()
	srv := &http.Server{Addr: *listen, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if id := r.Header.Get("Exec-Id"); id != "" && ledger != nil {
			// The execution: one append (one write(2)), before any
			// byte of the answer.
			mu.Lock()
			_, err := ledger.WriteString(id + "\n")
			mu.Unlock()
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if d := time.Duration(delay.Load()); r.Method == http.MethodPost && d > 0 {
				time.Sleep(d) // the work after the effect: a window to be cut in
			}
		}
		mu.Lock()
		code := status
		mu.Unlock()
		w.Header().Set("Served-By", name)
		w.WriteHeader(code)
		fmt.Fprintf(w, "pod %s\n", name)
	}), ConnState: func(c net.Conn, s http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch s {
		case http.StateNew:
			conns[c] = struct{}{}
		case http.StateClosed, http.StateHijacked:
			delete(conns, c)
		}
	}}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		if abrupt.Load() {
			// A process that dies at SIGTERM (or is killed): every
			// connection, idle or with a request in flight, is reset
			// (SO_LINGER 0) and so are connects not yet accepted.
			mu.Lock()
			for c := range conns {
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				}
			}
			os.Exit(1)
		}
		// A rollout: stop taking connections, finish those in flight,
		// as a well-behaved server does.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		os.Exit(0)
	}()
	fmt.Fprintln(os.Stderr, srv.ListenAndServe())
	os.Exit(1)
}

// SpreadResult is what spread prints.
type SpreadResult struct {
	Requests int            `json:"requests"`
	ByPod    map[string]int `json:"by_pod"`
	ByStatus map[string]int `json:"by_status"`
	// ViaEgret counts answers with Egret-Attempts (through egret).
	ViaEgret int `json:"via_egret"`
	// ByAttempts counts answers through egret by Egret-Attempts.
	ByAttempts map[string]int `json:"by_attempts"`
	Errors     int            `json:"errors"`
	Samples    []string       `json:"error_samples"`
}

// spread sends N GETs to URL one after another, each on a new connection
// with a new name lookup, and counts who answered.
func spread(args []string) int {
	fs := flag.NewFlagSet("spread", flag.ContinueOnError)
	n := fs.Int("n", 300, "requests")
	timeout := fs.Duration("timeout", 10*time.Second, "per request")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: testbin spread [-n N] URL")
		return 2
	}
	res := SpreadResult{ByPod: map[string]int{}, ByStatus: map[string]int{}, ByAttempts: map[string]int{}}
	c := &http.Client{Timeout: *timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := 0; i < *n; i++ {
		res.Requests++
		resp, err := c.Get(fs.Arg(0))
		if err != nil {
			res.Errors++
			if len(res.Samples) < 10 {
				res.Samples = append(res.Samples, err.Error())
			}
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		res.ByStatus[strconv.Itoa(resp.StatusCode)]++
		res.ByPod[resp.Header.Get("Served-By")]++
		if a := resp.Header.Get("Egret-Attempts"); a != "" {
			res.ViaEgret++
			res.ByAttempts[a]++
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// SidecarStats are what sidecar received.
type SidecarStats struct {
	Requests int `json:"requests"`
	Attempts int `json:"attempts"`
	// ByID counts the requests received by their Ledger-Id header.
	ByID map[string]int `json:"by_id"`
	// Errors are the first failures to forward.
	Errors []string `json:"errors"`
}

type origDstKey struct{}

// sidecar is a mesh sidecar's stand-in: the pod's nat OUTPUT rule sends
// every TCP connect but its own (its uid) here.
func sidecar(args []string) {
	fs := flag.NewFlagSet("sidecar", flag.ExitOnError)
	listen := fs.String("listen", ":15001", "where the redirected connections arrive")
	admin := fs.String("admin", ":15020", "where /stats is served")
	retries := fs.Int("retries", 2, "retries of a 503 or a failed connect")
	_ = fs.Parse(args)
	var mu sync.Mutex
	st := SidecarStats{ByID: map[string]int{}}
	am := http.NewServeMux()
	am.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	go func() { fmt.Fprintln(os.Stderr, http.ListenAndServe(*admin, am)); os.Exit(1) }()
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, ctx.Value(origDstKey{}).(string))
		},
	}
	srv := &http.Server{
		Addr: *listen,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			dst, err := originalDst(c.(*net.TCPConn))
			if err != nil {
				fmt.Fprintln(os.Stderr, "sidecar: SO_ORIGINAL_DST:", err)
				dst = ""
			}
			return context.WithValue(ctx, origDstKey{}, dst)
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return
			}
			mu.Lock()
			st.Requests++
			st.ByID[r.Header.Get("Ledger-Id")]++
			mu.Unlock()
			var resp *http.Response
			n := 0
			for ; n <= *retries; n++ {
				if resp != nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				out := r.Clone(r.Context())
				out.RequestURI = ""
				out.URL.Scheme, out.URL.Host = "http", r.Host
				out.Body = io.NopCloser(strings.NewReader(string(body)))
				mu.Lock()
				st.Attempts++
				mu.Unlock()
				resp, err = tr.RoundTrip(out)
				if err != nil {
					mu.Lock()
					if len(st.Errors) < 20 {
						st.Errors = append(st.Errors, err.Error())
					}
					mu.Unlock()
					resp = nil
					var op *net.OpError
					if errors.As(err, &op) && op.Op == "dial" {
						continue
					}
					break
				}
				if resp.StatusCode != http.StatusServiceUnavailable {
					break
				}
			}
			if resp == nil {
				http.Error(w, "sidecar: upstream connect failure", http.StatusServiceUnavailable)
				return
			}
			defer resp.Body.Close()
			for k, v := range resp.Header {
				w.Header()[k] = v
			}
			w.Header().Set("Sidecar-Attempts", strconv.Itoa(min(n+1, *retries+1)))
			w.WriteHeader(resp.StatusCode)
			_, _ = io.Copy(w, resp.Body)
		}),
	}
	fmt.Fprintln(os.Stderr, srv.ListenAndServe())
	os.Exit(1)
}

// originalDst is where a connection the nat table redirected was going.
func originalDst(c *net.TCPConn) (string, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return "", err
	}
	var addr string
	var serr error
	err = rc.Control(func(fd uintptr) {
		// struct sockaddr_in, read as the 16 bytes of an ipv6_mreq.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		addr = net.JoinHostPort(net.IPv4(b[4], b[5], b[6], b[7]).String(), strconv.Itoa(int(b[2])<<8|int(b[3])))
	})
	if err == nil {
		err = serr
	}
	return addr, err
}
