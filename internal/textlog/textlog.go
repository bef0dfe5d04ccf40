// Package textlog is a log/slog handler that writes exactly what
// slog.NewTextHandler writes, faster for the records a proxy logs per
// request: flat records of strings, numbers, booleans, durations and times
// are formatted in one pass into a pooled buffer and written in one call.
// Anything else (groups, errors and other values of kind Any, LogValuers)
// is handed to a slog.TextHandler with the same attributes, so the output
// is the same either way.
package textlog

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"
)

// Handler is a slog.Handler; see the package comment.
type Handler struct {
	w     io.Writer
	mu    *sync.Mutex
	level slog.Leveler
	pre   []byte       // " k=v" of the attributes given to WithAttrs
	slow  slog.Handler // the same handler as slog's, for everything else
	fast  bool         // false once WithGroup was used
}

var _ slog.Handler = (*Handler)(nil)

// New returns a handler writing to w. Only opts.Level is honoured (nil:
// Info); options that change the output (AddSource, ReplaceAttr) are
// refused with a nil handler and false.
func New(w io.Writer, opts *slog.HandlerOptions) (*Handler, bool) {
	var level slog.Leveler = slog.LevelInfo
	if opts != nil {
		if opts.AddSource || opts.ReplaceAttr != nil {
			return nil, false
		}
		if opts.Level != nil {
			level = opts.Level
		}
	}
	mu := &sync.Mutex{}
	slow := slog.NewTextHandler(lockedWriter{w: w, mu: mu}, &slog.HandlerOptions{Level: level})
	return &Handler{w: w, mu: mu, level: level, slow: slow, fast: true}, true
}

// lockedWriter serialises the slow handler's writes with the fast path's.
type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Enabled reports whether records at level are written.
func (h *Handler) Enabled(_ context.Context, level slog.Level) bool {
	return level >= h.level.Level()
}

// WithAttrs returns a handler that adds attrs to every record.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.slow = h.slow.WithAttrs(attrs)
	if c.fast {
		pre := append([]byte(nil), h.pre...)
		for _, a := range attrs {
			var ok bool
			if pre, ok = appendAttr(pre, a); !ok {
				c.fast = false
				break
			}
		}
		c.pre = pre
	}
	return &c
}

// WithGroup returns a handler that qualifies later keys with name; such a
// handler always formats through slog's.
func (h *Handler) WithGroup(name string) slog.Handler {
	c := *h
	c.slow = h.slow.WithGroup(name)
	if name != "" {
		c.fast = false
	}
	return &c
}

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// Handle writes one record as one line.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if !h.fast {
		return h.slow.Handle(ctx, r)
	}
	bp := bufs.Get().(*[]byte)
	b := (*bp)[:0]
	if !r.Time.IsZero() {
		b = append(b, "time="...)
		b = appendTime(b, r.Time)
		b = append(b, ' ')
	}
	b = append(b, "level="...)
	b = appendString(b, r.Level.String())
	b = append(b, " msg="...)
	b = appendString(b, r.Message)
	b = append(b, h.pre...)
	ok := true
	r.Attrs(func(a slog.Attr) bool {
		b, ok = appendAttr(b, a)
		return ok
	})
	if !ok {
		*bp = b
		bufs.Put(bp)
		return h.slow.Handle(ctx, r)
	}
	b = append(b, '\n')
	h.mu.Lock()
	_, err := h.w.Write(b)
	h.mu.Unlock()
	*bp = b
	if cap(b) <= 16<<10 {
		bufs.Put(bp)
	}
	return err
}

// appendAttr appends " key=value", or reports false for an attribute the
// fast path does not format. An empty attribute is left out, as slog does.
func appendAttr(b []byte, a slog.Attr) ([]byte, bool) {
	if a.Equal(slog.Attr{}) {
		return b, true
	}
	v := a.Value
	switch v.Kind() {
	case slog.KindString, slog.KindInt64, slog.KindUint64, slog.KindFloat64, slog.KindBool, slog.KindDuration, slog.KindTime:
	default:
		return b, false
	}
	b = append(b, ' ')
	b = appendString(b, a.Key)
	b = append(b, '=')
	switch v.Kind() {
	case slog.KindString:
		b = appendString(b, v.String())
	case slog.KindInt64:
		b = strconv.AppendInt(b, v.Int64(), 10)
	case slog.KindUint64:
		b = strconv.AppendUint(b, v.Uint64(), 10)
	case slog.KindFloat64:
		b = strconv.AppendFloat(b, v.Float64(), 'g', -1, 64)
	case slog.KindBool:
		b = strconv.AppendBool(b, v.Bool())
	case slog.KindDuration:
		b = append(b, v.Duration().String()...)
	case slog.KindTime:
		b = appendTime(b, v.Time())
	}
	return b, true
}

// appendTime appends t in RFC 3339 with exactly three digits of
// milliseconds (slog's text format). The date, the seconds and the zone are
// formatted once a second and reused.
func appendTime(b []byte, t time.Time) []byte {
	t = t.Truncate(time.Millisecond)
	if y := t.Year(); y < 0 || y > 9999 {
		// Not four digits: slog's own way (RFC3339Nano with a tenth of a
		// millisecond added, so that four fraction digits stay, then the
		// byte after the 23rd dropped), odd as it is for such years.
		const millis = len("2006-01-02T15:04:05.000")
		n := len(b)
		b = t.Add(time.Millisecond/10).AppendFormat(b, time.RFC3339Nano)
		if len(b) > n+millis {
			b = append(b[:n+millis], b[n+millis+1:]...)
		}
		return b
	}
	sec := t.Unix()
	c := lastSecond.Load()
	if c == nil || c.sec != sec || c.loc != t.Location() {
		c = newSecond(t)
		lastSecond.Store(c)
	}
	b = append(b, c.prefix...)
	ms := t.Nanosecond() / int(time.Millisecond)
	b = append(b, '.', byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10))
	return append(b, c.zone...)
}

// second is the formatted text of one second in one location.
type second struct {
	sec    int64
	loc    *time.Location
	prefix string // 2006-01-02T15:04:05
	zone   string // Z or -07:00
}

var lastSecond atomic.Pointer[second]

func newSecond(t time.Time) *second {
	const layout = "2006-01-02T15:04:05"
	full := t.Format(time.RFC3339)
	return &second{sec: t.Unix(), loc: t.Location(), prefix: full[:len(layout)], zone: full[len(layout):]}
}

// appendString appends s, quoted when slog's text format quotes it.
func appendString(b []byte, s string) []byte {
	if needsQuoting(s) {
		return strconv.AppendQuote(b, s)
	}
	return append(b, s...)
}

// needsQuoting: an empty string; an ASCII space, '=', '"' or control
// character (not DEL); a non-ASCII rune that is invalid, a space or not
// printable.
func needsQuoting(s string) bool {
	if s == "" {
		return true
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c <= ' ' || c == '=' || c == '"' {
				return true
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return true
		}
		i += size
	}
	return false
}
