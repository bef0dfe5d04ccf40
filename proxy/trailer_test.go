package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestTrailerBareLFAnswersAtOnce (finding 6): a chunked request whose
// trailer section ends in bare LFs is forwarded when its last byte
// arrives, not when the client's next bytes do; the next request on the
// connection is read from the right place.
func TestTrailerBareLFAnswersAtOnce(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, r.URL.Path+" "+string(b))
	})
	p := startProxy(t, Config{Timeouts: Timeouts{ReadTimeout: time.Minute}})
	for _, trailer := range []string{"X-T: 1\n\n", "X-T: 1\n\r\n", "X-T: 1\r\n\n", "\n"} {
		c := sendRaw(t, p.addr, "POST "+up.url("/one")+" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"+trailer)
		// A failure bound, not a wait: the answer needs no more bytes.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("trailer %q: no answer until the client sends more: %v", trailer, err)
		}
		if body := readAll(t, resp.Body); resp.StatusCode != 200 || body != "/one abc" {
			t.Fatalf("trailer %q: %d %q", trailer, resp.StatusCode, body)
		}
		io.WriteString(c, "GET "+up.url("/two")+" HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err = http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("trailer %q: the next request: %v", trailer, err)
		}
		if body := readAll(t, resp.Body); resp.StatusCode != 200 || body != "/two " {
			t.Fatalf("trailer %q: the next request: %d %q", trailer, resp.StatusCode, body)
		}
		c.Close()
	}
}

// TestStalledChunkedBody408 (finding 6): a chunked body that stalls, in a
// chunk or in its trailer section, is answered 408 as a stalled
// Content-Length body is, and nothing reaches the upstream.
func TestStalledChunkedBody408(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) })
	p := startProxy(t, Config{Timeouts: Timeouts{ReadTimeout: 300 * time.Millisecond}})
	for _, tc := range []struct{ name, framing, body string }{
		{"content-length", "Content-Length: 10", "abc"},
		{"chunked, in a chunk", "Transfer-Encoding: chunked", "a\r\nabc"},
		{"chunked, at a chunk size", "Transfer-Encoding: chunked", "3\r\nabc\r\n"},
		{"chunked, in the trailer", "Transfer-Encoding: chunked", "3\r\nabc\r\n0\r\nX-T: 1\r\n"},
	} {
		c := sendRaw(t, p.addr, "POST "+up.url("/")+" HTTP/1.1\r\nHost: x\r\n"+tc.framing+"\r\n\r\n"+tc.body)
		resp, body := readAnswer(t, c)
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(body, "not received in time") {
			t.Errorf("%s: %d %q, want 408", tc.name, resp.StatusCode, body)
		}
	}
	if n := up.requests.Load(); n != 0 {
		t.Errorf("%d stalled requests reached the upstream", n)
	}
}
