package cli

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is an io.Writer safe to read while written; block, when not
// nil, holds every Write until it is closed.
type lockedBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes int
	block  chan struct{}
	inside chan struct{} // gets a value as a Write starts waiting on block
	wrote  chan struct{} // gets a value (if it has room) after each Write
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	if w.block != nil {
		select {
		case w.inside <- struct{}{}:
		default:
		}
		<-w.block
	}
	w.mu.Lock()
	w.writes++
	n, err := w.b.Write(p)
	w.mu.Unlock()
	select {
	case w.wrote <- struct{}{}:
	default:
	}
	return n, err
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// Lines from many writers, more than a buffer holds: every one comes out
// once, whole, and each writer's in the order it wrote them; in batches.
func TestLogWriterKeepsEveryLineInOrder(t *testing.T) {
	out := &lockedBuffer{}
	l := newLogWriter(out)
	const writers, lines = 8, 3000
	pad := strings.Repeat("x", 40)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range lines {
				if _, err := fmt.Fprintf(l, "w=%d i=%d %s\n", w, i, pad); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	next := make([]int, writers)
	n := 0
	for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		var w, i int
		var p string
		if _, err := fmt.Sscanf(line, "w=%d i=%d %s", &w, &i, &p); err != nil || p != pad || w < 0 || w >= writers {
			t.Fatalf("line %d is not a line written: %q", n, line)
		}
		if i != next[w] {
			t.Fatalf("writer %d: line %d came where line %d was due", w, i, next[w])
		}
		next[w]++
		n++
	}
	if n != writers*lines {
		t.Fatalf("%d lines out, %d written", n, writers*lines)
	}
	// More than a buffer's worth: written in several batches, each of many
	// lines (a timed flush may take a short one).
	if out.writes < 2 || out.writes > n/100 {
		t.Errorf("%d writes for %d lines: not batched", out.writes, n)
	}
}

// A batch whose write stalls does not hold up the lines logged meanwhile;
// they go out after it, in order.
func TestLogWriterDoesNotWaitForAStalledWrite(t *testing.T) {
	out := &lockedBuffer{block: make(chan struct{}), inside: make(chan struct{}, 1)}
	l := newLogWriter(out)
	fmt.Fprintln(l, "first")
	select {
	case <-out.inside: // the timed flush is writing "first" and stalls
	case <-time.After(5 * time.Second):
		t.Fatal("the first line was not flushed within 5s")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 100 {
			fmt.Fprintf(l, "during %d\n", i)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		close(out.block)
		t.Fatal("Write waited for a stalled write of an earlier batch")
	}
	close(out.block)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	want.WriteString("first\n")
	for i := range 100 {
		fmt.Fprintf(&want, "during %d\n", i)
	}
	if got := out.String(); got != want.String() {
		t.Fatalf("out:\n%s\nwant:\n%s", got, want.String())
	}
}

// A line goes out within the flush interval without a Close; after Close
// lines go straight through.
func TestLogWriterFlushesAndCloses(t *testing.T) {
	out := &lockedBuffer{wrote: make(chan struct{}, 1)}
	l := newLogWriter(out)
	start := time.Now()
	fmt.Fprintln(l, "one")
	// The writer flushes on its own clock (logFlushEvery), the delay
	// measured here; the flush's write into out is the event.
	timeout := time.After(5 * time.Second)
	for out.String() != "one\n" {
		select {
		case <-out.wrote:
		case <-timeout:
			t.Fatalf("not written out within 5s: %q", out.String())
		}
	}
	if d := time.Since(start); d < logFlushEvery/2 {
		t.Errorf("written out after %v: not batched (interval %v)", d, logFlushEvery)
	}
	fmt.Fprintln(l, "two")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "one\ntwo\n" {
		t.Fatalf("after Close: %q", got)
	}
	fmt.Fprintln(l, "three")
	if got := out.String(); got != "one\ntwo\nthree\n" {
		t.Fatalf("a line after Close: %q", got)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}
