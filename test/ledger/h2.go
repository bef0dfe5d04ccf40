package ledger

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"hash"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The receive windows the ledger advertises: large, so that a client never
// waits on them; the connection window is topped up as DATA arrives.
const (
	h2StreamWindow = 1 << 30
	h2ConnWindow   = 1 << 30
)

type h2stream struct {
	id     uint32
	head   *head
	fault  Fault
	hasher hash.Hash
	n      int64
	// cutAt > 0: reset-mid-request resets once n reaches it.
	cutAt int64
	// preset is the answer of a request that is not executed (answered
	// once its body has been read and discarded).
	preset *answer
	window int64 // our send window on this stream
	reset  bool  // reset by either side
	ended  bool  // the request's END_STREAM arrived
}

type answeredStream struct {
	id string
	at time.Time
}

// recentAnswers is how long an answered stream counts as collateral of a
// connection reset.
const recentAnswers = time.Second

type h2conn struct {
	s      *Server
	c, raw net.Conn
	proto  string
	fr     *http2.Framer

	wmu  sync.Mutex // framer writes, the hpack encoder, bw
	bw   *bufio.Writer
	henc *hpack.Encoder
	hbuf bytes.Buffer

	mu             sync.Mutex // everything below
	cond           *sync.Cond
	connWindow     int64
	peerInitWindow int64
	peerMaxFrame   int
	streams        map[uint32]*h2stream // open streams
	maxSeen        uint32
	goingAway      bool
	lastStream     uint32
	resetOnReuse   bool
	// answered lists the streams answered lately: a connection reset can
	// destroy an answer the client has not read yet.
	answered  []answeredStream
	finishing bool // GOAWAY done: write side closed
	dead      bool
	handlers  sync.WaitGroup
}

// serveH2 serves HTTP/2 on a connection whose client preface has been read.
func (s *Server) serveH2(c, raw net.Conn, br *bufio.Reader, proto string) {
	hc := &h2conn{
		s: s, c: c, raw: raw, proto: proto,
		bw:             bufio.NewWriterSize(c, 32<<10),
		connWindow:     65535,
		peerInitWindow: 65535,
		peerMaxFrame:   16384,
		streams:        make(map[uint32]*h2stream),
	}
	hc.cond = sync.NewCond(&hc.mu)
	hc.fr = http2.NewFramer(hc.bw, br)
	hc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	hc.fr.MaxHeaderListSize = 1 << 20
	hc.henc = hpack.NewEncoder(&hc.hbuf)
	defer func() {
		hc.mu.Lock()
		hc.dead = true
		hc.cond.Broadcast()
		hc.mu.Unlock()
		c.Close()
		hc.handlers.Wait()
	}()

	hc.write(func() error {
		if err := hc.fr.WriteSettings(
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 1000},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2StreamWindow},
		); err != nil {
			return err
		}
		return hc.fr.WriteWindowUpdate(0, h2ConnWindow-65535)
	})
	for {
		hc.mu.Lock()
		if !hc.finishing {
			c.SetReadDeadline(time.Now().Add(s.idle()))
		}
		hc.mu.Unlock()
		f, err := hc.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			hc.mu.Lock()
			f.ForeachSetting(func(st http2.Setting) error {
				switch st.ID {
				case http2.SettingInitialWindowSize:
					d := int64(st.Val) - hc.peerInitWindow
					hc.peerInitWindow = int64(st.Val)
					for _, x := range hc.streams {
						x.window += d
					}
				case http2.SettingMaxFrameSize:
					hc.peerMaxFrame = int(st.Val)
				}
				return nil
			})
			hc.cond.Broadcast()
			hc.mu.Unlock()
			hc.write(func() error { return hc.fr.WriteSettingsAck() })
		case *http2.PingFrame:
			if !f.IsAck() {
				data := f.Data
				hc.write(func() error { return hc.fr.WritePing(true, data) })
			}
		case *http2.WindowUpdateFrame:
			hc.mu.Lock()
			if f.StreamID == 0 {
				hc.connWindow += int64(f.Increment)
			} else if x := hc.streams[f.StreamID]; x != nil {
				x.window += int64(f.Increment)
			}
			hc.cond.Broadcast()
			hc.mu.Unlock()
		case *http2.MetaHeadersFrame:
			if !hc.onHeaders(f) {
				return
			}
		case *http2.DataFrame:
			hc.onData(f)
		case *http2.RSTStreamFrame:
			hc.mu.Lock()
			if x := hc.streams[f.StreamID]; x != nil {
				x.reset = true
				delete(hc.streams, f.StreamID)
			}
			hc.cond.Broadcast()
			hc.mu.Unlock()
			hc.maybeFinishGoAway()
		}
	}
}

// write runs fn (framer writes) under the write lock and flushes.
func (hc *h2conn) write(fn func() error) error {
	hc.wmu.Lock()
	defer hc.wmu.Unlock()
	if err := fn(); err != nil {
		return err
	}
	return hc.bw.Flush()
}

// decide changes the connection's state under mu (a stream ended, a
// GOAWAY) and writes the frame that tells the client, as one step under the
// write lock: a GOAWAY's half-close (maybeFinishGoAway), which may follow
// from the new state, cannot come between them and leave the client
// without the frame.
func (hc *h2conn) decide(change func(), frame func() error) error {
	hc.wmu.Lock()
	defer hc.wmu.Unlock()
	hc.mu.Lock()
	change()
	hc.mu.Unlock()
	if hc.s.frameDecided != nil {
		hc.s.frameDecided(hc)
	}
	if err := frame(); err != nil {
		return err
	}
	return hc.bw.Flush()
}

func (hc *h2conn) rst(id uint32, code http2.ErrCode) {
	hc.decide(func() {
		if x := hc.streams[id]; x != nil {
			x.reset = true
			delete(hc.streams, id)
			hc.noteAnsweredLocked(x.head.id)
		}
		hc.cond.Broadcast()
	}, func() error { return hc.fr.WriteRSTStream(id, code) })
	hc.maybeFinishGoAway()
}

// onHeaders handles a request head (or trailers); false ends the connection.
func (hc *h2conn) onHeaders(f *http2.MetaHeadersFrame) bool {
	id := f.StreamID
	hc.mu.Lock()
	if x := hc.streams[id]; x != nil {
		// Trailers end the request.
		hc.mu.Unlock()
		if f.StreamEnded() {
			hc.endRequest(x)
		}
		return true
	}
	if id <= hc.maxSeen {
		hc.mu.Unlock()
		return true
	}
	if hc.goingAway && id > hc.lastStream {
		// Above our GOAWAY: not processed.
		hc.mu.Unlock()
		for _, fld := range f.RegularFields() {
			if strings.EqualFold(fld.Name, HeaderID) {
				hc.s.bystander(fld.Value)
			}
		}
		return true
	}
	prevMax := hc.maxSeen
	hc.maxSeen = id
	victim := hc.resetOnReuse
	hc.mu.Unlock()

	hdr := make(http.Header)
	for _, fld := range f.RegularFields() {
		hdr.Add(http.CanonicalHeaderKey(fld.Name), fld.Value)
	}
	h := newHead(hdr, f.PseudoValue("method"), f.PseudoValue("path"), hc.proto)
	if victim {
		hc.s.victim(h)
		hc.mu.Lock()
		var cut []string
		for _, x := range hc.streams {
			cut = append(cut, x.head.id)
		}
		for _, a := range hc.answered {
			if time.Since(a.at) < recentAnswers {
				cut = append(cut, a.id)
			}
		}
		hc.mu.Unlock()
		hc.s.collateral(cut)
		reset(hc.c, hc.raw)
		return false
	}
	if hc.s.Introspect && strings.HasPrefix(h.path, IntrospectPrefix) {
		p, _, _ := strings.Cut(h.path, "?")
		a := hc.s.introspect(p)
		x := &h2stream{id: id, head: h, preset: &a, hasher: sha256.New()}
		hc.mu.Lock()
		x.window = hc.peerInitWindow
		hc.streams[id] = x
		hc.mu.Unlock()
		if f.StreamEnded() {
			hc.endRequest(x)
		}
		return true
	}
	hc.s.mu.Lock()
	hc.s.notifyLocked()
	hc.s.stats.H2Streams++
	hc.s.mu.Unlock()
	flt := hc.s.arrive(h)
	x := &h2stream{id: id, head: h, fault: flt, hasher: sha256.New()}
	hc.mu.Lock()
	x.window = hc.peerInitWindow
	hc.streams[id] = x
	hc.mu.Unlock()

	switch {
	case h.faultErr != nil:
		a := plainAnswer(http.StatusBadRequest, "ledger: "+h.faultErr.Error()+"\n")
		x.preset = &a
	case flt.Kind == KindRefusedStream:
		hc.rst(id, http2.ErrCodeRefusedStream)
		return true
	case flt.Kind == KindGoAway:
		hc.decide(func() {
			hc.goingAway = true
			hc.lastStream = prevMax
			delete(hc.streams, id)
			hc.noteAnsweredLocked(h.id)
		}, func() error { return hc.fr.WriteGoAway(prevMax, http2.ErrCodeNo, []byte("ledger fault goaway")) })
		hc.maybeFinishGoAway()
		return true
	case flt.Kind == KindResetBeforeRead:
		hc.rst(id, http2.ErrCodeInternal)
		return true
	case flt.Kind == KindResetMidRequest:
		if f.StreamEnded() {
			hc.rst(id, http2.ErrCodeInternal)
			return true
		}
		x.cutAt = 1
		if cl, err := strconv.ParseInt(hdr.Get("Content-Length"), 10, 64); err == nil && cl > 1 {
			x.cutAt = cl / 2
		}
	case flt.Kind == KindStatus408 || flt.Kind == KindStatus425 || flt.Kind == KindStatus429:
		a := faultAnswer(flt, false)
		x.preset = &a
	}
	if f.StreamEnded() {
		hc.endRequest(x)
	}
	return true
}

func (hc *h2conn) onData(f *http2.DataFrame) {
	id := f.StreamID
	data := f.Data()
	if n := f.Length; n > 0 {
		// Flow control counts every DATA frame, even one we ignore.
		hc.write(func() error { return hc.fr.WriteWindowUpdate(0, n) })
	}
	hc.mu.Lock()
	x := hc.streams[id]
	hc.mu.Unlock()
	if x == nil || x.ended {
		return
	}
	x.hasher.Write(data)
	x.n += int64(len(data))
	if x.cutAt > 0 && x.n >= x.cutAt {
		hc.rst(id, http2.ErrCodeInternal)
		return
	}
	if f.StreamEnded() {
		hc.endRequest(x)
	}
}

// endRequest runs the request whose body is complete.
func (hc *h2conn) endRequest(x *h2stream) {
	x.ended = true
	if x.cutAt > 0 {
		// The whole body came in one frame before the cut: reset anyway.
		hc.rst(x.id, http2.ErrCodeInternal)
		return
	}
	hc.handlers.Add(1)
	go func() {
		defer hc.handlers.Done()
		if x.preset != nil {
			hc.respond(x, *x.preset, false)
			return
		}
		var sum [32]byte
		x.hasher.Sum(sum[:0])
		a := hc.s.execute(x.head, x.n, sum)
		f := x.fault
		switch f.Kind {
		case KindResetAfterRead:
			hc.rst(x.id, http2.ErrCodeInternal)
			return
		case KindHold:
			if f.Interim && hc.interim(x) != nil {
				return
			}
			if !hc.s.sleep(f.Hold) {
				return
			}
		case KindStatus500, KindStatus502, KindStatus503, KindStatus504:
			a = faultAnswer(f, true)
		case KindResetMidBody:
			hc.respond(x, a, true)
			return
		case KindResetOnReuse:
			// Armed before the answer goes out: the client may open its
			// next stream as soon as it has read it.
			hc.mu.Lock()
			hc.resetOnReuse = true
			hc.mu.Unlock()
		}
		hc.respond(x, a, false)
		switch f.Kind {
		case KindCloseIdle:
			if hc.s.sleep(f.Hold) {
				hc.s.countIdleClose()
				hc.goAwayIdle()
			}
		}
	}()
}

// goAwayIdle closes the connection as idle: GOAWAY above the last stream
// seen, then the half-close once the streams below it are done.
func (hc *h2conn) goAwayIdle() {
	var last uint32
	hc.decide(func() {
		hc.goingAway = true
		hc.lastStream = hc.maxSeen
		last = hc.lastStream
	}, func() error { return hc.fr.WriteGoAway(last, http2.ErrCodeNo, []byte("idle")) })
	hc.maybeFinishGoAway()
}

// interim sends a 100 Continue on the stream.
func (hc *h2conn) interim(x *h2stream) error {
	return hc.write(func() error {
		hc.hbuf.Reset()
		hc.henc.WriteField(hpack.HeaderField{Name: ":status", Value: "100"})
		return hc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: x.id, BlockFragment: hc.hbuf.Bytes(), EndHeaders: true})
	})
}

// respond writes the answer on the stream; half writes the headers and
// half the body, then resets the stream.
func (hc *h2conn) respond(x *h2stream, a answer, half bool) {
	body := a.body
	if x.head.method == http.MethodHead {
		body = nil
	}
	end := len(body) == 0 && !half
	err := hc.write(func() error {
		hc.hbuf.Reset()
		hc.henc.WriteField(hpack.HeaderField{Name: ":status", Value: strconv.Itoa(a.status)})
		for _, k := range sortedKeys(a.header) {
			for _, v := range a.header[k] {
				hc.henc.WriteField(hpack.HeaderField{Name: strings.ToLower(k), Value: v})
			}
		}
		hc.henc.WriteField(hpack.HeaderField{Name: "content-length", Value: strconv.Itoa(len(a.body))})
		return hc.fr.WriteHeaders(http2.HeadersFrameParam{
			StreamID: x.id, BlockFragment: hc.hbuf.Bytes(), EndHeaders: true, EndStream: end,
		})
	})
	if err != nil {
		return
	}
	if half {
		body = body[:len(body)/2]
	}
	for len(body) > 0 {
		hc.mu.Lock()
		for !hc.dead && !x.reset && (hc.connWindow <= 0 || x.window <= 0) {
			hc.cond.Wait()
		}
		if hc.dead || x.reset {
			hc.mu.Unlock()
			return
		}
		k := min(int64(len(body)), hc.connWindow, x.window, int64(hc.peerMaxFrame))
		hc.connWindow -= k
		x.window -= k
		hc.mu.Unlock()
		chunk := body[:k]
		body = body[k:]
		last := len(body) == 0 && !half
		if hc.write(func() error { return hc.fr.WriteData(x.id, last, chunk) }) != nil {
			return
		}
	}
	if half {
		hc.rst(x.id, http2.ErrCodeInternal)
		return
	}
	hc.mu.Lock()
	delete(hc.streams, x.id)
	hc.noteAnsweredLocked(x.head.id)
	hc.mu.Unlock()
	hc.maybeFinishGoAway()
}

// noteAnsweredLocked remembers that the stream of id got its last frame
// (answer, RST_STREAM or GOAWAY) now.
func (hc *h2conn) noteAnsweredLocked(id string) {
	now := time.Now()
	keep := hc.answered[:0]
	for _, a := range hc.answered {
		if now.Sub(a.at) < recentAnswers {
			keep = append(keep, a)
		}
	}
	hc.answered = append(keep, answeredStream{id, now})
}

// maybeFinishGoAway closes the connection once a GOAWAY was sent and every
// stream it kept has finished.
//
// It decides under the write lock, so that a frame decided before (see
// decide) is on the wire before the write side closes.
func (hc *h2conn) maybeFinishGoAway() {
	hc.mu.Lock()
	going := hc.goingAway && !hc.finishing
	hc.mu.Unlock()
	if !going {
		return // the common case, without waiting for the write lock
	}
	hc.wmu.Lock()
	defer hc.wmu.Unlock()
	hc.mu.Lock()
	if !hc.goingAway {
		hc.mu.Unlock()
		return
	}
	for id := range hc.streams {
		if id <= hc.lastStream {
			hc.mu.Unlock()
			return
		}
	}
	if hc.finishing {
		hc.mu.Unlock()
		return
	}
	hc.finishing = true
	hc.mu.Unlock()
	// Half-close and let the client close: closing with unread bytes in
	// the receive buffer would send a RST that can destroy the answers the
	// client has not read yet.
	hc.bw.Flush()
	if cw, ok := hc.c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		hc.c.SetReadDeadline(time.Now().Add(2 * time.Second))
		return
	}
	hc.c.Close()
}
