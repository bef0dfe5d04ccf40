package ledger

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// serveH1 is the HTTP/1.1 loop on one connection. c is the connection (TLS
// or not), raw the TCP connection under it (for resets).
func (s *Server) serveH1(c, raw net.Conn, br *bufio.Reader) {
	defer c.Close()
	bw := bufio.NewWriterSize(c, 16<<10)
	resetOnReuse := false
	for {
		c.SetReadDeadline(time.Now().Add(s.idle()))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		h := newHead(req.Header, req.Method, req.URL.RequestURI(), "HTTP/1.1")
		if resetOnReuse {
			// The previous answer left this connection looking reusable;
			// the client's next request is reset unread.
			s.victim(h)
			reset(c, raw)
			return
		}
		c.SetReadDeadline(time.Time{})
		if s.Introspect && strings.HasPrefix(req.URL.Path, IntrospectPrefix) {
			if !s.drainAndAnswer(c, bw, req, s.introspect(req.URL.Path)) {
				return
			}
			continue
		}
		f := s.arrive(h)
		if h.faultErr != nil || f.Kind.HTTP2Only() {
			msg := fmt.Sprintf("ledger: fault %q needs HTTP/2\n", f.Kind)
			if h.faultErr != nil {
				msg = "ledger: " + h.faultErr.Error() + "\n"
			}
			if !s.drainAndAnswer(c, bw, req, plainAnswer(http.StatusBadRequest, msg)) {
				return
			}
			continue
		}
		switch f.Kind {
		case KindResetBeforeRead:
			reset(c, raw)
			return
		case KindResetMidRequest:
			continue100(bw, req)
			if req.ContentLength > 0 {
				io.CopyN(io.Discard, req.Body, max(1, req.ContentLength/2))
			} else if req.ContentLength < 0 {
				io.CopyN(io.Discard, req.Body, 1024)
			}
			reset(c, raw)
			return
		case KindStatus408, KindStatus425, KindStatus429:
			if !s.drainAndAnswer(c, bw, req, faultAnswer(f, false)) {
				return
			}
			continue
		}
		continue100(bw, req)
		hs := sha256.New()
		n, err := io.Copy(hs, req.Body)
		if err != nil {
			// The client did not send the whole body: nothing executed.
			return
		}
		var sum [32]byte
		hs.Sum(sum[:0])
		a := s.execute(h, n, sum)
		closing := req.Close
		switch f.Kind {
		case KindResetAfterRead:
			reset(c, raw)
			return
		case KindHold:
			if f.Interim {
				bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
				if bw.Flush() != nil {
					return
				}
			}
			if !s.sleep(f.Hold) {
				return
			}
		case KindStatus500, KindStatus502, KindStatus503, KindStatus504:
			a = faultAnswer(f, true)
		case KindResetMidBody:
			writeHead(bw, a, req.Method, closing, len(a.body))
			bw.Write(a.body[:len(a.body)/2])
			bw.Flush()
			reset(c, raw)
			return
		}
		if err := writeAnswer(bw, a, req.Method, closing); err != nil || closing {
			return
		}
		switch f.Kind {
		case KindCloseIdle:
			s.sleep(f.Hold)
			s.countIdleClose()
			return
		case KindResetOnReuse:
			resetOnReuse = true
		}
	}
}

// continue100 answers Expect: 100-continue before the body is read.
func continue100(bw *bufio.Writer, req *http.Request) {
	if req.Header.Get("Expect") == "100-continue" && req.ProtoAtLeast(1, 1) {
		bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		bw.Flush()
	}
}

// drainAndAnswer answers a request that is not executed after reading and
// discarding its body (so that the connection stays usable). It reports
// whether the connection may serve another request.
func (s *Server) drainAndAnswer(c net.Conn, bw *bufio.Writer, req *http.Request, a answer) bool {
	continue100(bw, req)
	if _, err := io.Copy(io.Discard, req.Body); err != nil {
		return false
	}
	if err := writeAnswer(bw, a, req.Method, req.Close); err != nil {
		return false
	}
	return !req.Close
}

func writeHead(bw *bufio.Writer, a answer, method string, closing bool, length int) {
	fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\n", a.status, http.StatusText(a.status))
	for _, k := range sortedKeys(a.header) {
		for _, v := range a.header[k] {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	bw.WriteString("Content-Length: ")
	bw.WriteString(strconv.Itoa(length))
	bw.WriteString("\r\n")
	if closing {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
}

func writeAnswer(bw *bufio.Writer, a answer, method string, closing bool) error {
	writeHead(bw, a, method, closing, len(a.body))
	if method != http.MethodHead {
		bw.Write(a.body)
	}
	return bw.Flush()
}
