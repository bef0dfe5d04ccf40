package textlog

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"testing"
	"time"
)

// both logs the same records through slog's text handler and ours and
// returns the two outputs.
func both(t testing.TB, do func(l *slog.Logger)) (theirs, ours string) {
	var a, b bytes.Buffer
	h, ok := New(&b, nil)
	if !ok {
		t.Fatal("New refused nil options")
	}
	do(slog.New(fixedTime{slog.NewTextHandler(&a, nil)}))
	do(slog.New(fixedTime{h}))
	return a.String(), b.String()
}

// fixedTime gives records stamped by a Logger (time.Now) the fixed time at,
// so that the two handlers' outputs can be compared byte for byte.
type fixedTime struct{ slog.Handler }

func (f fixedTime) Handle(ctx context.Context, r slog.Record) error {
	if !r.Time.IsZero() && time.Since(r.Time).Abs() < time.Minute { // stamped now, not by the test
		r.Time = at
	}
	return f.Handler.Handle(ctx, r)
}

func (f fixedTime) WithAttrs(as []slog.Attr) slog.Handler { return fixedTime{f.Handler.WithAttrs(as)} }
func (f fixedTime) WithGroup(name string) slog.Handler    { return fixedTime{f.Handler.WithGroup(name)} }

var at = time.Date(2026, 12, 2, 17, 4, 5, 123456789, time.FixedZone("X", 3600))

func record(msg string, attrs ...slog.Attr) func(*slog.Logger) {
	return func(l *slog.Logger) {
		r := slog.NewRecord(at, slog.LevelInfo, msg, 0)
		r.AddAttrs(attrs...)
		l.Handler().Handle(context.Background(), r)
	}
}

func TestSameBytesAsSlog(t *testing.T) {
	strs := []string{"", "plain", "with space", "a=b", `quo"te`, `back\slash`, "tab\there", "new\nline",
		"\x00nul", "\x7fdel", "ünïcödé", "\u00a0nbsp", "\u2028sep", "bad\xffutf8", "emoji😀", "<>&", "http://h:1/p?q=1"}
	var cases []func(*slog.Logger)
	for _, s := range strs {
		cases = append(cases, record(s, slog.String(s, s)))
	}
	cases = append(cases,
		record("request", slog.String("id", "8e13ac3b035fce95"), slog.String("method", "GET"),
			slog.String("url", "http://127.0.0.1:18080/hello"), slog.Int("attempts", 2), slog.String("outcome", "relayed"),
			slog.Int("status", 200), slog.Duration("duration", 17498861*time.Nanosecond)),
		record("numbers", slog.Int64("neg", -5), slog.Uint64("u", math.MaxUint64), slog.Float64("f", 0.1),
			slog.Float64("big", 1e300), slog.Float64("nan", math.NaN()), slog.Float64("inf", math.Inf(-1)), slog.Bool("b", true)),
		record("times", slog.Time("t", at), slog.Time("whole", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
			slog.Time("zero", time.Time{}), slog.Duration("d", 0)),
		record("empty attr", slog.Attr{}, slog.String("after", "x")),
		record("slow: error", slog.Any("err", errors.New("boom")), slog.String("k", "v")),
		record("slow: group", slog.Group("g", slog.String("a", "1"))),
		func(l *slog.Logger) { l.With("pod", "default/web", "n", 3).Info("request", "status", 200) },
		func(l *slog.Logger) { l.With("err", errors.New("x")).Info("slow with") },
		func(l *slog.Logger) { l.WithGroup("grp").With("a", 1).Info("grouped", "b", 2) },
		func(l *slog.Logger) { l.WithGroup("").Info("empty group", "b", 2) },
		func(l *slog.Logger) { l.Debug("not enabled") },
		func(l *slog.Logger) { l.Warn("warned") },
		func(l *slog.Logger) { l.Log(context.Background(), slog.LevelError+2, "error+2") },
		func(l *slog.Logger) {
			r := slog.NewRecord(time.Time{}, slog.LevelInfo, "no time", 0)
			l.Handler().Handle(context.Background(), r)
		},
	)
	for i, c := range cases {
		theirs, ours := both(t, c)
		if theirs != ours {
			t.Errorf("case %d:\nslog %q\nours %q", i, theirs, ours)
		}
	}
}

func TestOptionsThatChangeTheOutputAreRefused(t *testing.T) {
	if _, ok := New(io.Discard, &slog.HandlerOptions{AddSource: true}); ok {
		t.Fatal("AddSource accepted")
	}
	if _, ok := New(io.Discard, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr { return a }}); ok {
		t.Fatal("ReplaceAttr accepted")
	}
	h, ok := New(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn})
	if !ok || h.Enabled(context.Background(), slog.LevelInfo) || !h.Enabled(context.Background(), slog.LevelWarn) {
		t.Fatal("level not honoured")
	}
}

// FuzzSameBytesAsSlog: any string as key, value and message is written as
// slog writes it.
func FuzzSameBytesAsSlog(f *testing.F) {
	for _, s := range []string{"", "a b", "x=y", "\"", "\xff", "é", "\u0085", "\t"} {
		f.Add(s, s, int64(1))
	}
	f.Fuzz(func(t *testing.T, k, v string, n int64) {
		theirs, ours := both(t, func(l *slog.Logger) {
			record(v, slog.String(k, v), slog.Int64(v, n), slog.Duration(k, time.Duration(n)))(l.With(k, v))
		})
		if theirs != ours {
			t.Fatalf("\nslog %q\nours %q", theirs, ours)
		}
	})
}

// BenchmarkRequestLine: one proxy request line, slog's handler and ours.
func BenchmarkRequestLine(b *testing.B) {
	attrs := []slog.Attr{slog.String("id", "8e13ac3b035fce95"), slog.String("method", "GET"),
		slog.String("url", "http://127.0.0.1:18080/hello"), slog.String("upstream", "127.0.0.1:18080"), slog.Int("attempts", 1),
		slog.String("outcome", "relayed"), slog.Int("status", 200), slog.Duration("duration", 17498861*time.Nanosecond)}
	ours, _ := New(io.Discard, nil)
	for _, tc := range []struct {
		name string
		h    slog.Handler
	}{{"slog", slog.NewTextHandler(io.Discard, nil)}, {"textlog", ours}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				r := slog.NewRecord(at, slog.LevelInfo, "request", 0)
				r.AddAttrs(attrs...)
				tc.h.Handle(context.Background(), r)
			}
		})
	}
}

// TestTimesAsSlog: record times across seconds, zones and odd years are
// written as slog writes them (the formatted second is cached).
func TestTimesAsSlog(t *testing.T) {
	zones := []*time.Location{time.UTC, time.Local, time.FixedZone("E", 5*3600+1800), time.FixedZone("W", -7*3600)}
	base := []time.Time{at, time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 5e8, time.UTC), time.Date(-3, 6, 1, 12, 0, 0, 1e6, time.UTC), time.Unix(0, 0)}
	for _, b0 := range base {
		for _, z := range zones {
			for _, d := range []time.Duration{0, time.Millisecond - 1, 999 * time.Millisecond, time.Second, 90 * time.Minute} {
				tm := b0.In(z).Add(d)
				theirs, ours := both(t, func(l *slog.Logger) {
					r := slog.NewRecord(tm, slog.LevelInfo, "t", 0)
					r.AddAttrs(slog.Time("v", tm))
					l.Handler().Handle(context.Background(), r)
				})
				if theirs != ours {
					t.Fatalf("%v:\nslog %q\nours %q", tm, theirs, ours)
				}
			}
		}
	}
}
