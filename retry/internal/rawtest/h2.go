package rawtest

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// H2Action is what the raw HTTP/2 server does with a request stream.
type H2Action int

const (
	H2Answer         H2Action = iota // read it whole, answer 200 "ok" (executed)
	H2Refuse                         // RST_STREAM REFUSED_STREAM on its HEADERS
	H2GoAwayBelow                    // GOAWAY with last-stream-id below it, then close
	H2GoAwayBelowErr                 // the same with an error code
	H2GoAwayCovers                   // read it whole, GOAWAY covering it, close (executed, no answer)
	H2ResetAfterRead                 // read it whole, RST_STREAM INTERNAL_ERROR (executed, no answer)
)

// H2Server speaks HTTP/2 with prior knowledge through a bare Framer and
// does to the i-th request (from 1) what plan(i) says.
func H2Server(t *testing.T, plan func(i int64) H2Action, executed *atomic.Int64) *Server {
	var requests atomic.Int64
	return NewServer(t, func(c net.Conn, _ int) {
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
			return
		}
		fr := http2.NewFramer(c, c)
		if err := fr.WriteSettings(); err != nil {
			return
		}
		actions := map[uint32]H2Action{}
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					fr.WriteSettingsAck()
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					fr.WritePing(true, f.Data)
				}
			case *http2.HeadersFrame:
				id := f.StreamID
				a := plan(requests.Add(1))
				actions[id] = a
				switch a {
				case H2Refuse:
					fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
					delete(actions, id)
					continue
				case H2GoAwayBelow, H2GoAwayBelowErr:
					code := http2.ErrCodeNo
					if a == H2GoAwayBelowErr {
						code = http2.ErrCodeEnhanceYourCalm
					}
					fr.WriteGoAway(id-1, code, nil) // the last stream before this one
					// Not synchronisation: a server closes a moment after
					// its GOAWAY, as real ones do.
					time.Sleep(20 * time.Millisecond)
					return
				}
				if f.StreamEnded() {
					if !h2Finish(fr, id, a, executed) {
						return
					}
				}
			case *http2.DataFrame:
				id := f.StreamID
				if len(f.Data()) > 0 {
					fr.WriteWindowUpdate(0, uint32(len(f.Data())))
				}
				a, ok := actions[id]
				if ok && f.StreamEnded() {
					if !h2Finish(fr, id, a, executed) {
						return
					}
				}
			}
		}
	})
}

// h2Finish completes a whole request; false means close the connection.
func h2Finish(fr *http2.Framer, id uint32, a H2Action, executed *atomic.Int64) bool {
	executed.Add(1)
	if a == H2ResetAfterRead {
		fr.WriteRSTStream(id, http2.ErrCodeInternal)
		return true
	}
	if a == H2GoAwayCovers {
		fr.WriteGoAway(id, http2.ErrCodeNo, nil)
		time.Sleep(20 * time.Millisecond) // not synchronisation: the close a moment after the GOAWAY, as above
		return false
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
	enc.WriteField(hpack.HeaderField{Name: "content-length", Value: "2"})
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
	fr.WriteData(id, true, []byte("ok"))
	return true
}

// H2Error sends one POST on rt to a raw HTTP/2 server that does a to it,
// and returns RoundTrip's error.
func H2Error(t *testing.T, rt http.RoundTripper, a H2Action) error {
	t.Helper()
	var executed atomic.Int64
	srv := H2Server(t, func(int64) H2Action { return a }, &executed)
	resp, err := rt.RoundTrip(Post(t, srv.URL(), "x"))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("action %d: status %d, want an error", a, resp.StatusCode)
	}
	return err
}
