package bpfload

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/egret-proxy/egret/bpf"
)

// EventType says what happened to a tracked socket.
type EventType uint32

// Event types.
const (
	EventState      EventType = bpf.EventState      // TCP state change
	EventReset      EventType = bpf.EventReset      // RST received
	EventRetransmit EventType = bpf.EventRetransmit // segment retransmitted
	EventRTO        EventType = bpf.EventRTO        // retransmission timeout fired
)

func (t EventType) String() string {
	switch t {
	case EventState:
		return "state"
	case EventReset:
		return "reset"
	case EventRetransmit:
		return "retransmit"
	case EventRTO:
		return "rto"
	}
	return fmt.Sprintf("event(%d)", uint32(t))
}

// Event is one ring buffer record about one of egret's upstream sockets.
type Event struct {
	Time         time.Time
	Cookie       uint64 // socket cookie, see SocketCookie
	Type         EventType
	OldState     uint8 // for EventState; otherwise the current state
	NewState     uint8
	TxBytes      uint64 // payload bytes handed to IP so far
	BytesAcked   uint64
	DataSegsOut  uint32
	TotalRetrans uint32
}

// ErrClosed is returned by EventReader.Read after Close.
var ErrClosed = errors.New("bpfload: event reader closed")

// EventReader reads the witness ring buffer. A ring buffer has one
// consumer: open one reader per agent.
type EventReader struct {
	r *ringbuf.Reader
}

// Events opens a reader on the witness ring buffer.
func (l *Loader) Events() (*EventReader, error) {
	r, err := ringbuf.NewReader(l.objs.EgretEvents)
	if err != nil {
		return nil, fmt.Errorf("bpfload: ring buffer: %w", err)
	}
	return &EventReader{r: r}, nil
}

// SetDeadline makes Read return os.ErrDeadlineExceeded after t.
func (e *EventReader) SetDeadline(t time.Time) { e.r.SetDeadline(t) }

// Read blocks for the next event.
func (e *EventReader) Read() (Event, error) {
	rec, err := e.r.Read()
	if err != nil {
		if errors.Is(err, ringbuf.ErrClosed) {
			return Event{}, ErrClosed
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return Event{}, err
		}
		return Event{}, fmt.Errorf("bpfload: ring buffer: %w", err)
	}
	var raw bpf.EgretEvent
	if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &raw); err != nil {
		return Event{}, fmt.Errorf("bpfload: event: %w", err)
	}
	return Event{
		Time:         bootToWall(raw.TsNs),
		Cookie:       raw.Cookie,
		Type:         EventType(raw.Type),
		OldState:     uint8(raw.OldState),
		NewState:     uint8(raw.NewState),
		TxBytes:      raw.TxBytes,
		BytesAcked:   raw.BytesAcked,
		DataSegsOut:  raw.DataSegsOut,
		TotalRetrans: raw.TotalRetrans,
	}, nil
}

// Close stops the reader; a blocked Read returns ErrClosed.
func (e *EventReader) Close() error { return e.r.Close() }
