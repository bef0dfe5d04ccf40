package ledger

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// rawH1 sends one request on conn c and reads the answer.
func rawH1(t *testing.T, c net.Conn, br *bufio.Reader, method, id, fault string, body []byte, extra ...string) (*http.Response, error) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "%s /x HTTP/1.1\r\nHost: ledger\r\n%s: %s\r\n", method, HeaderID, id)
	if fault != "" {
		fmt.Fprintf(&b, "%s: %s\r\n", HeaderFault, fault)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", extra[i], extra[i+1])
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n", len(body))
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, b.String()); err != nil {
		return nil, err
	}
	if _, err := c.Write(body); err != nil {
		return nil, err
	}
	return http.ReadResponse(br, nil)
}

func dial(t *testing.T, addr net.Addr) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

func TestH1NormalAndBodyHash(t *testing.T) {
	s, addr := Start(t)
	c, br := dial(t, addr)
	body := bytes.Repeat([]byte("egret"), 1000)
	resp, err := rawH1(t, c, br, "POST", "a", "", body, HeaderResponseSize, "1000")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || len(got) != 1000 {
		t.Fatalf("status %d, %d bytes, %v", resp.StatusCode, len(got), err)
	}
	sum := sha256.Sum256(body)
	if h := resp.Header.Get(HeaderBodySHA256); h != hex.EncodeToString(sum[:]) {
		t.Fatalf("body hash %s", h)
	}
	r := s.Record("a")
	if r.Arrivals != 1 || len(r.Executions) != 1 || r.Executions[0].BodySize != 5000 || r.Executions[0].Method != "POST" {
		t.Fatalf("record %+v", r)
	}
	// Keep-alive: a second request on the same connection.
	resp, err = rawH1(t, c, br, "GET", "b", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("second request: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	if s.Executions("b") != 1 || s.Stats().Connections != 1 {
		t.Fatalf("stats %+v", s.Stats())
	}
}

func TestIdempotencyKey(t *testing.T) {
	s, addr := Start(t)
	c, br := dial(t, addr)
	get := func(id, key string, body string) *http.Response {
		resp, err := rawH1(t, c, br, "POST", id, "", []byte(body), HeaderIdemKey, key)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		return resp
	}
	r1 := get("p1", "k1", "pay 10")
	r2 := get("p1", "k1", "pay 10")
	if r1.StatusCode != 200 || r2.StatusCode != 200 || r2.Header.Get(HeaderReplayed) != "1" || r1.Header.Get(HeaderReplayed) != "" {
		t.Fatalf("answers %d %d replayed %q", r1.StatusCode, r2.StatusCode, r2.Header.Get(HeaderReplayed))
	}
	if n := s.Executions("p1"); n != 1 {
		t.Fatalf("executions %d, want 1", n)
	}
	if r := s.Record("p1"); r.Replays != 1 || r.Arrivals != 2 {
		t.Fatalf("record %+v", r)
	}
	if r3 := get("p2", "k1", "pay 20"); r3.StatusCode != http.StatusUnprocessableEntity || s.Executions("p2") != 0 {
		t.Fatalf("key reused with another body: %d", r3.StatusCode)
	}
	// An executed fault stores the answer: the retry is a replay.
	resp, err := rawH1(t, c, br, "POST", "p3", "503; times=1", []byte("x"), HeaderIdemKey, "k3")
	if err != nil || resp.StatusCode != 503 || resp.Header.Get(HeaderExecuted) != "1" {
		t.Fatalf("503 fault: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if r := get("p3", "k3", "x"); r.StatusCode != 200 || r.Header.Get(HeaderReplayed) != "1" || s.Executions("p3") != 1 {
		t.Fatalf("replay after executed fault: %d, executions %d", r.StatusCode, s.Executions("p3"))
	}
}

func TestH1StatusFaults(t *testing.T) {
	s, addr := Start(t)
	c, br := dial(t, addr)
	for _, k := range []Kind{KindStatus408, KindStatus425, KindStatus429, KindStatus500, KindStatus502, KindStatus503, KindStatus504} {
		id := "s" + string(k)
		resp, err := rawH1(t, c, br, "PUT", id, string(k)+"; times=1; retry-after=2", []byte("body"))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != k.Status() {
			t.Fatalf("%s: status %d", k, resp.StatusCode)
		}
		if k == KindStatus429 && resp.Header.Get("Retry-After") != "2" {
			t.Fatalf("429 Retry-After %q", resp.Header.Get("Retry-After"))
		}
		want := 0
		if k.Executes() {
			want = 1
		}
		if n := s.Executions(id); n != want {
			t.Fatalf("%s: executions %d, want %d", k, n, want)
		}
		// times=1: the second arrival succeeds.
		resp, err = rawH1(t, c, br, "PUT", id, string(k)+"; times=1", []byte("body"))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s second arrival: %v", k, err)
		}
		io.Copy(io.Discard, resp.Body)
		if n := s.Executions(id); n != want+1 {
			t.Fatalf("%s: executions %d after success", k, n)
		}
	}
}

func TestH1Resets(t *testing.T) {
	s, addr := Start(t)
	body := bytes.Repeat([]byte("z"), 64<<10)
	cases := []struct {
		kind     Kind
		executed int
		headers  bool // the response headers arrive first
	}{
		{KindResetBeforeRead, 0, false},
		{KindResetMidRequest, 0, false},
		{KindResetAfterRead, 1, false},
		{KindResetMidBody, 1, true},
	}
	for _, tc := range cases {
		t.Run(string(tc.kind), func(t *testing.T) {
			c, br := dial(t, addr)
			id := "r" + string(tc.kind)
			resp, err := rawH1(t, c, br, "POST", id, string(tc.kind), body, HeaderResponseSize, "4096")
			if tc.headers {
				if err != nil {
					t.Fatalf("headers: %v", err)
				}
				_, err = io.ReadAll(resp.Body)
			}
			if err == nil {
				t.Fatalf("no error from a %s", tc.kind)
			}
			if !isReset(err) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.EPIPE) {
				t.Fatalf("error %v is not a reset", err)
			}
			r := s.Record(id)
			if len(r.Executions) != tc.executed || r.Arrivals != 1 || r.Faults[tc.kind] != 1 {
				t.Fatalf("record %+v", r)
			}
		})
	}
}

func TestH1Hold(t *testing.T) {
	s, addr := Start(t)
	c, br := dial(t, addr)
	start := time.Now()
	resp, err := rawH1(t, c, br, "POST", "h", "hold; ms=300", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("answered after %v", d)
	}
	if s.Executions("h") != 1 {
		t.Fatal("hold did not execute")
	}
	// A client that gives up first still leaves an execution behind.
	c2, _ := dial(t, addr)
	fmt.Fprintf(c2, "POST / HTTP/1.1\r\nHost: l\r\n%s: h2\r\n%s: hold; ms=2000\r\nContent-Length: 1\r\n\r\nx", HeaderID, HeaderFault)
	// The execution, from the ledger's own event.
	s.Await(5*time.Second, func() bool { return s.Executions("h2") > 0 })
	c2.Close()
	if s.Executions("h2") != 1 {
		t.Fatal("held request not executed")
	}
}

// TestH1HoldInterim: hold with interim=1 sends 100 Continue at once, then
// the answer after the hold.
func TestH1HoldInterim(t *testing.T) {
	s, addr := Start(t)
	c, br := dial(t, addr)
	start := time.Now()
	interim, err := rawH1(t, c, br, "POST", "hi", "hold; ms=300; interim=1", []byte("x"))
	if err != nil || interim.StatusCode != http.StatusContinue {
		t.Fatalf("first response %v %v, want 100", interim, err)
	}
	if d := time.Since(start); d >= 300*time.Millisecond {
		t.Fatalf("100 Continue only after %v", d)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("final response %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("answered after %v", d)
	}
	if s.Executions("hi") != 1 {
		t.Fatal("hold did not execute")
	}
}

func TestH1CloseIdleAndResetOnReuse(t *testing.T) {
	s, addr := Start(t)
	c, br := dial(t, addr)
	resp, err := rawH1(t, c, br, "GET", "ci", "close-idle", nil)
	if err != nil || resp.StatusCode != 200 || resp.Close {
		t.Fatalf("close-idle answer: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection not closed with a FIN: %v", err)
	}
	if s.Stats().IdleCloses != 1 || s.Executions("ci") != 1 {
		t.Fatalf("stats %+v", s.Stats())
	}

	c, br = dial(t, addr)
	resp, err = rawH1(t, c, br, "GET", "ru", "reset-on-reuse", nil)
	if err != nil || resp.StatusCode != 200 || resp.Close {
		t.Fatalf("reset-on-reuse answer: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	_, err = rawH1(t, c, br, "POST", "victim", "", []byte("v"))
	if !isReset(err) && err != io.EOF {
		t.Fatalf("reused connection: %v", err)
	}
	if r := s.Record("victim"); len(r.Executions) != 0 || r.Victims != 1 {
		t.Fatalf("victim record %+v", r)
	}
}

func TestRefusing(t *testing.T) {
	r, err := Refusing(net.IPv4(127, 0, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, err = net.DialTimeout("tcp", r.Addr.String(), time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v", r.Addr, err)
	}
}

// h2Client speaks raw frames to the ledger.
type h2Client struct {
	c    net.Conn
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
}

func dialH2(t *testing.T, addr net.Addr) *h2Client {
	t.Helper()
	c, _ := dial(t, addr)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, h2Preface)
	hc := &h2Client{c: c, fr: http2.NewFramer(c, c)}
	hc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	hc.enc = hpack.NewEncoder(&hc.hbuf)
	hc.fr.WriteSettings()
	return hc
}

func (hc *h2Client) request(id uint32, ledgerID, fault string, body []byte) {
	hc.hbuf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "ledger"}, {":path", "/"},
		{"ledger-id", ledgerID}, {"ledger-fault", fault}, {"content-length", fmt.Sprint(len(body))}} {
		hc.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	hc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hc.hbuf.Bytes(), EndHeaders: true, EndStream: len(body) == 0})
	if len(body) > 0 {
		hc.fr.WriteData(id, true, body)
	}
}

// next returns the next frame that concerns a stream or the connection's
// end (settings, pings and window updates are skipped).
func (hc *h2Client) next(t *testing.T) http2.Frame {
	for {
		f, err := hc.fr.ReadFrame()
		if err != nil {
			return nil
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				hc.fr.WriteSettingsAck()
			}
			continue
		case *http2.WindowUpdateFrame, *http2.PingFrame:
			continue
		}
		return f
	}
}

func TestH2RefusedStreamAndGoAway(t *testing.T) {
	s, addr := Start(t)
	hc := dialH2(t, addr)
	hc.request(1, "rs", "refused-stream", []byte("abc"))
	f := hc.next(t)
	rst, ok := f.(*http2.RSTStreamFrame)
	if !ok || rst.StreamID != 1 || rst.ErrCode != http2.ErrCodeRefusedStream {
		t.Fatalf("want RST_STREAM REFUSED_STREAM on 1, got %#v", f)
	}
	// Stream 3 is held (executed), stream 5 asks for GOAWAY: the GOAWAY says
	// 3 is the last stream, 3 is answered, 5 is not executed.
	hc.request(3, "kept", "hold; ms=200", []byte("k"))
	// 3 has arrived before 5 asks for the GOAWAY (the ledger's event).
	if !s.Await(5*time.Second, func() bool { return s.Record("kept").Arrivals > 0 }) {
		t.Fatal("stream 3 never executed")
	}
	hc.request(5, "ga", "goaway", nil)
	var goaway *http2.GoAwayFrame
	var status3 string
	for f := hc.next(t); f != nil; f = hc.next(t) {
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			goaway = f
		case *http2.MetaHeadersFrame:
			if f.StreamID == 3 {
				status3 = f.PseudoValue("status")
			}
		}
	}
	if goaway == nil || goaway.LastStreamID != 3 || goaway.ErrCode != http2.ErrCodeNo {
		t.Fatalf("goaway %#v", goaway)
	}
	if status3 != "200" {
		t.Fatalf("stream 3 below the GOAWAY answered %q", status3)
	}
	if s.Executions("rs") != 0 || s.Executions("ga") != 0 || s.Executions("kept") != 1 {
		t.Fatalf("records %+v", s.Records())
	}
}

func TestH2StreamResets(t *testing.T) {
	s, addr := Start(t)
	hc := dialH2(t, addr)
	cases := []struct {
		kind     Kind
		executed int
		headers  bool
	}{
		{KindResetBeforeRead, 0, false},
		{KindResetMidRequest, 0, false},
		{KindResetAfterRead, 1, false},
		{KindResetMidBody, 1, true},
		{KindStatus502, 1, true},
		{KindStatus429, 0, true},
	}
	for i, tc := range cases {
		id := uint32(2*i + 1)
		hc.request(id, "h2"+string(tc.kind), string(tc.kind), bytes.Repeat([]byte("q"), 1000))
		var sawHeaders, sawRST bool
		for !sawRST {
			f := hc.next(t)
			if f == nil {
				t.Fatalf("%s: connection ended", tc.kind)
			}
			if f.Header().StreamID != id {
				continue
			}
			if _, ok := f.(*http2.MetaHeadersFrame); ok {
				sawHeaders = true
			}
			if _, ok := f.(*http2.RSTStreamFrame); ok {
				sawRST = true
			}
			if d, ok := f.(*http2.DataFrame); ok && d.StreamEnded() {
				break
			}
			if mh, ok := f.(*http2.MetaHeadersFrame); ok && mh.StreamEnded() {
				break
			}
		}
		if sawHeaders != tc.headers {
			t.Fatalf("%s: headers %v", tc.kind, sawHeaders)
		}
		if tc.kind.Status() == 0 && !sawRST {
			t.Fatalf("%s: no RST_STREAM", tc.kind)
		}
		if n := s.Executions("h2" + string(tc.kind)); n != tc.executed {
			t.Fatalf("%s: executions %d", tc.kind, n)
		}
	}
}

func TestH2ClientsAndTLS(t *testing.T) {
	s, addr := Start(t)
	tlsAddr, err := s.ListenTLS("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h2c := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, n, a string, _ *tls.Config) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, n, a)
	}}
	cfg, err := s.ClientTLSConfig("h2", "http/1.1")
	if err != nil {
		t.Fatal(err)
	}
	h2tls := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	cfg1, _ := s.ClientTLSConfig("http/1.1")
	h1tls := &http.Transport{TLSClientConfig: cfg1}
	for _, tc := range []struct {
		name  string
		rt    http.RoundTripper
		url   string
		proto string
	}{
		{"h2c", h2c, "http://" + addr.String(), "HTTP/2.0"},
		{"tls-h2", h2tls, "https://" + tlsAddr.String(), "HTTP/2.0"},
		{"tls-h1", h1tls, "https://" + tlsAddr.String(), "HTTP/1.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Concurrent requests, bodies over the default flow-control
			// windows, and a large answer.
			var wg sync.WaitGroup
			errs := make(chan error, 20)
			for i := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					body := bytes.Repeat([]byte{byte(i)}, 100<<10+i)
					req, _ := http.NewRequest("PUT", tc.url+"/p", bytes.NewReader(body))
					req.Header.Set(HeaderID, fmt.Sprintf("%s-%d", tc.name, i))
					req.Header.Set(HeaderResponseSize, "200000")
					resp, err := tc.rt.RoundTrip(req)
					if err != nil {
						errs <- err
						return
					}
					defer resp.Body.Close()
					got, err := io.ReadAll(resp.Body)
					sum := sha256.Sum256(body)
					switch {
					case err != nil:
						errs <- err
					case resp.Proto != tc.proto || len(got) != 200000:
						errs <- fmt.Errorf("proto %s, %d bytes", resp.Proto, len(got))
					case resp.Header.Get(HeaderBodySHA256) != hex.EncodeToString(sum[:]):
						errs <- fmt.Errorf("body hash differs")
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for i := range 20 {
				r := s.Record(fmt.Sprintf("%s-%d", tc.name, i))
				if len(r.Executions) != 1 || r.Executions[0].Proto != tc.proto || r.Executions[0].BodySize != int64(100<<10+i) {
					t.Fatalf("record %+v", r)
				}
			}
		})
	}
}

// TestH2HoldInterim: on HTTP/2, hold with interim=1 sends a 100 HEADERS
// frame (not ending the stream) at once, then the answer after the hold.
func TestH2HoldInterim(t *testing.T) {
	s, addr := Start(t)
	hc := dialH2(t, addr)
	start := time.Now()
	hc.request(1, "h2i", "hold; ms=300; interim=1", []byte("x"))
	var statuses []string
	for f := hc.next(t); f != nil && len(statuses) < 2; f = hc.next(t) {
		h, ok := f.(*http2.MetaHeadersFrame)
		if !ok || h.StreamID != 1 {
			continue
		}
		statuses = append(statuses, h.PseudoValue("status"))
		if len(statuses) == 1 {
			if h.StreamEnded() {
				t.Fatal("the interim HEADERS ended the stream")
			}
			if d := time.Since(start); d >= 300*time.Millisecond {
				t.Fatalf("100 only after %v", d)
			}
		}
	}
	if len(statuses) != 2 || statuses[0] != "100" || statuses[1] != "200" {
		t.Fatalf("statuses %q, want 100 then 200", statuses)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("answered after %v", d)
	}
	if s.Executions("h2i") != 1 {
		t.Fatal("hold did not execute")
	}
}

func TestParseFault(t *testing.T) {
	f, err := ParseFault("429; times=2; retry-after=1")
	if err != nil || f.Kind != KindStatus429 || f.Times != 2 || f.RetryAfter != 1 {
		t.Fatalf("%+v %v", f, err)
	}
	if g, err := ParseFault(f.String()); err != nil || g != f {
		t.Fatalf("round trip %+v %v", g, err)
	}
	if f, err := ParseFault("hold; ms=300; interim=1"); err != nil || !f.Interim || f.Hold != 300*time.Millisecond {
		t.Fatalf("interim %+v %v", f, err)
	} else if g, err := ParseFault(f.String()); err != nil || g != f {
		t.Fatalf("interim round trip %q: %+v %v", f.String(), g, err)
	}
	for _, bad := range []string{"explode", "503; times=x", "503; when=1", "503; times", "503; interim=1", "hold; interim=2"} {
		if _, err := ParseFault(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
	if f, _ := ParseFault("hold"); f.Hold != time.Second {
		t.Fatalf("hold default %v", f.Hold)
	}
}

func TestIPv6AndIntrospection(t *testing.T) {
	s := New()
	s.Introspect = true
	defer s.Close()
	addr, err := s.Listen("tcp6", "[::1]:0")
	if err != nil {
		testenv.Require(t, false, "IPv6 loopback: "+err.Error())
	}
	c, br := dial(t, addr)
	resp, err := rawH1(t, c, br, "DELETE", "v6", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("over ::1: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	fmt.Fprintf(c, "GET %srecords/v6 HTTP/1.1\r\nHost: l\r\n\r\n", IntrospectPrefix)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	var r Record
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.ID != "v6" || len(r.Executions) != 1 || r.Executions[0].Method != "DELETE" {
		t.Fatalf("introspected %+v %v", r, err)
	}
	if st := s.Stats(); st.Arrivals != 1 {
		t.Fatalf("introspection was recorded: %+v", st)
	}
}

func TestH2Attribution(t *testing.T) {
	s, addr := Start(t)
	// reset-on-reuse: the next stream resets the connection; the stream in
	// flight on it is collateral, the new one a victim.
	hc := dialH2(t, addr)
	hc.request(1, "inflight", "hold; ms=2000", []byte("x"))
	s.Await(5*time.Second, func() bool { return s.Executions("inflight") > 0 })
	hc.request(3, "reuse", "reset-on-reuse", nil)
	for f := hc.next(t); f != nil; f = hc.next(t) {
		if d, ok := f.(*http2.DataFrame); ok && d.StreamID == 3 && d.StreamEnded() {
			break
		}
	}
	hc.request(5, "next", "", nil)
	for f := hc.next(t); f != nil; f = hc.next(t) {
	}
	if r := s.Record("next"); r.Victims != 1 || len(r.Executions) != 0 {
		t.Fatalf("victim %+v", r)
	}
	if r := s.Record("inflight"); r.Collateral != 1 {
		t.Fatalf("collateral %+v", r)
	}
	// goaway: a stream opened after the GOAWAY is a bystander, not an
	// arrival.
	hc = dialH2(t, addr)
	hc.request(1, "ga2", "goaway", nil)
	hc.request(3, "after", "", nil)
	for f := hc.next(t); f != nil; f = hc.next(t) {
	}
	// The client may see the half-close before the server read stream 3:
	// wait for the ledger's count of the bystander.
	s.Await(5*time.Second, func() bool { return s.Record("after").Bystander > 0 })
	if r := s.Record("after"); r.Bystander != 1 || r.Arrivals != 0 || len(r.Executions) != 0 {
		t.Fatalf("bystander %+v", r)
	}
}

func TestH1ExpectContinue(t *testing.T) {
	s, addr := Start(t)
	c, br := dial(t, addr)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "PUT /e HTTP/1.1\r\nHost: l\r\n%s: e\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n", HeaderID)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("want 100 Continue before the body, got %q %v", line, err)
	}
	br.ReadString('\n')
	io.WriteString(c, "hello")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	if r := s.Record("e"); len(r.Executions) != 1 || r.Executions[0].BodySize != 5 {
		t.Fatalf("record %+v", r)
	}
}

// TestH2RefusalNotLostToTheClose: a refusal (RST_STREAM REFUSED_STREAM, a
// GOAWAY below the stream) is decided while something else on the
// connection closes it (another request's close-idle GOAWAY, the end of a
// GOAWAY's last kept stream). The client must still get the refusal frame
// before the connection ends: without it a refused stream looks like one
// the server took and dropped (an EOF, or a GOAWAY whose last stream
// covers it), and a truthful client must call it sent.
func TestH2RefusalNotLostToTheClose(t *testing.T) {
	for _, tc := range []struct {
		fault string
		race  func(hc *h2conn) // what closes the connection meanwhile
		check func(f http2.Frame) bool
	}{
		{"refused-stream", (*h2conn).goAwayIdle, func(f http2.Frame) bool {
			rst, ok := f.(*http2.RSTStreamFrame)
			return ok && rst.StreamID == 1 && rst.ErrCode == http2.ErrCodeRefusedStream
		}},
		{"goaway", (*h2conn).maybeFinishGoAway, func(f http2.Frame) bool {
			ga, ok := f.(*http2.GoAwayFrame)
			return ok && ga.LastStreamID == 0
		}},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			s, addr := Start(t)
			var first atomic.Bool
			s.frameDecided = func(hc *h2conn) {
				if first.Swap(true) {
					return
				}
				done := make(chan struct{})
				go func() { tc.race(hc); close(done) }()
				// Give the close every chance to overtake the frame.
				select {
				case <-done:
				case <-time.After(100 * time.Millisecond):
				}
			}
			hc := dialH2(t, addr)
			hc.request(1, "r1", tc.fault, nil)
			var frames []string
			seen := false
			for f := hc.next(t); f != nil; f = hc.next(t) {
				frames = append(frames, fmt.Sprintf("%T", f))
				seen = seen || tc.check(f)
			}
			if !seen {
				t.Fatalf("the refusal never reached the client before the connection ended: frames %v", frames)
			}
			if s.Executions("r1") != 0 {
				t.Fatalf("a refused stream executed")
			}
		})
	}
}

// TestAwaitWakesOnTheChange: Await returns on the execution itself, and
// gives up after its timeout on a state that never comes.
func TestAwaitWakesOnTheChange(t *testing.T) {
	s, addr := Start(t)
	done := make(chan bool)
	go func() { done <- s.Await(10*time.Second, func() bool { return s.Executions("await") == 1 }) }()
	req, _ := http.NewRequest("GET", "http://"+addr.String()+"/", nil)
	req.Header.Set(HeaderID, "await")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !<-done {
		t.Fatal("Await missed the execution")
	}
	start := time.Now()
	if s.Await(20*time.Millisecond, func() bool { return s.Executions("never") > 0 }) {
		t.Fatal("Await reported a state that never came")
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Fatal("Await gave up before its timeout")
	}
}
