package client

import (
	"bytes"

	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Action is what the raw HTTP/2 server does with a request stream.
type h2Action int

// h2RawServer speaks HTTP/2 with prior knowledge through a bare Framer and
// does to the i-th request (from 1) what plan(i) says.
func h2RawServer(t *testing.T, plan func(i int64) h2Action, executed *atomic.Int64) *rawServer {
	var requests atomic.Int64
	return newRawServer(t, func(c net.Conn, _ int) {
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
			return
		}
		fr := http2.NewFramer(c, c)
		if err := fr.WriteSettings(); err != nil {
			return
		}
		actions := map[uint32]h2Action{}
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
				case h2Refuse:
					fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
					delete(actions, id)
					continue
				case h2GoAwayBelow, h2GoAwayBelowErr:
					code := http2.ErrCodeNo
					if a == h2GoAwayBelowErr {
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
func h2Finish(fr *http2.Framer, id uint32, a h2Action, executed *atomic.Int64) bool {
	executed.Add(1)
	if a == h2ResetAfterRead {
		fr.WriteRSTStream(id, http2.ErrCodeInternal)
		return true
	}
	if a == h2GoAwayCovers {
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

const (
	h2Answer         h2Action = iota // read it whole, answer 200 "ok" (executed)
	h2Refuse                         // RST_STREAM REFUSED_STREAM on its HEADERS
	h2GoAwayBelow                    // GOAWAY with last-stream-id below it, then close
	h2GoAwayBelowErr                 // the same with an error code
	h2GoAwayCovers                   // read it whole, GOAWAY covering it, close (executed, no answer)
	h2ResetAfterRead                 // read it whole, RST_STREAM INTERNAL_ERROR (executed, no answer)
)
