package proxy

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// A gRPC call egret answers itself gets it as Trailers-Only on the wire:
// one HEADERS frame with END_STREAM carrying grpc-status, no DATA frame.
// A HEADERS frame without END_STREAM and then an empty DATA frame that
// ends the stream is read by grpc-go as response headers without
// trailers (INTERNAL, "server closed the stream without sending
// trailers"): the grpc-status and egret-outcome would be lost, as they
// were when the answer was flushed.
func TestH2CGRPCAnswerIsTrailersOnly(t *testing.T) {
	up := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		panic(http.ErrAbortHandler) // read, then reset: ambiguous
	})
	p := startProxy(t, Config{Mode: Transparent, Resolver: &StaticResolver{Dst: addrPortOf(t, up)}})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "svc.example"},
		{":path", "/pkg.S/M"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	// A gRPC message: not compressed, 4 bytes.
	if err := fr.WriteData(1, true, []byte{0, 0, 0, 0, 4, 'c', 'a', 'l', 'l'}); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no answer on stream 1: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.DataFrame:
			if f.StreamID == 1 {
				t.Fatalf("DATA frame (%d bytes, END_STREAM %v) on the stream: want Trailers-Only", len(f.Data()), f.StreamEnded())
			}
		case *http2.RSTStreamFrame:
			t.Fatalf("stream %d reset: %v", f.StreamID, f.ErrCode)
		case *http2.MetaHeadersFrame:
			if f.StreamID != 1 {
				continue
			}
			fields := map[string]string{}
			for _, hf := range f.Fields {
				fields[hf.Name] = hf.Value
			}
			if !f.StreamEnded() {
				t.Fatalf("HEADERS without END_STREAM (%v): want Trailers-Only", fields)
			}
			if fields[":status"] != "200" || fields["grpc-status"] != "2" || fields["egret-outcome"] != "ambiguous" || fields["egret-attempts"] != "1" {
				t.Fatalf("Trailers-Only %v: want :status 200, grpc-status 2 (UNKNOWN), egret-outcome ambiguous, egret-attempts 1", fields)
			}
			return
		}
	}
}
