package spool

import (
	"errors"
	"io"
	"testing"

	"github.com/egret-proxy/egret/engine"
)

// A stream body is read as it comes, never ahead: the first dispatch gets
// each piece as the client sends it, and a retry's reader replays what was
// kept, then goes on with the stream.
func TestStreamReplaysWhatWasKept(t *testing.T) {
	pr, pw := io.Pipe()
	b := NewStream(pr, 16)
	defer b.Release()
	go pw.Write([]byte("ping"))
	buf := make([]byte, 64)
	n, err := b.Read(buf)
	if err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("first piece %q, %v", buf[:n], err)
	}
	if b.Done() || b.BodyKind() != engine.BodyReplayable || b.Len() != -1 {
		t.Fatalf("done %v kind %v len %d", b.Done(), b.BodyKind(), b.Len())
	}
	// The first dispatch waits on the client for more; the retry's
	// reader still replays what is kept.
	stale := make(chan string, 1)
	go func() {
		n, _ := b.Read(buf)
		stale <- string(buf[:n])
	}()
	r, err := b.Reopen()
	if err != nil {
		t.Fatal(err)
	}
	rb := make([]byte, 64)
	n, err = r.Read(rb)
	if err != nil || string(rb[:n]) != "ping" {
		t.Fatalf("replayed %q, %v", rb[:n], err)
	}
	// The next piece reaches whichever reader waits on the stream; the
	// retry's reader gets it either way, and then the end.
	go func() {
		pw.Write([]byte("pong"))
		pw.Close()
	}()
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "pong" {
		t.Fatalf("retry read the rest as %q, %v", got, err)
	}
	if s := <-stale; s != "pong" && s != "" {
		t.Fatalf("stale reader got %q", s)
	}
	if !b.Done() {
		t.Fatal("not done after the end")
	}
}

// Past memory bytes the kept part is dropped: one-shot, Reopen refused, a
// reader behind fails rather than skipping bytes; the first dispatch goes
// on to the end.
func TestStreamOutgrowsMemory(t *testing.T) {
	pr, pw := io.Pipe()
	b := NewStream(pr, 4)
	defer b.Release()
	r, err := b.Reopen() // a retry's reader, before anything was read
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		pw.Write([]byte("abc"))
		pw.Write([]byte("defgh"))
		pw.Close()
	}()
	got, err := io.ReadAll(b)
	if err != nil || string(got) != "abcdefgh" {
		t.Fatalf("first dispatch %q, %v", got, err)
	}
	if b.BodyKind() != engine.BodyOneShot {
		t.Fatalf("kind %v", b.BodyKind())
	}
	if _, err := b.Reopen(); !errors.Is(err, ErrNotReplayable) {
		t.Fatalf("Reopen: %v", err)
	}
	if _, err := r.Read(make([]byte, 8)); !errors.Is(err, ErrNotReplayable) {
		t.Fatalf("reader behind: %v", err)
	}
}
