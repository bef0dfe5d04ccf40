package spool

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/egret-proxy/egret/engine"
)

var lim = Limits{Memory: 16, Spool: 64}

// countingReader counts what was read from the client's stream.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestKindsByLength(t *testing.T) {
	cases := []struct {
		size    int
		known   bool
		want    engine.Body
		spooled bool
	}{
		{0, true, engine.BodyNone, false},
		{0, false, engine.BodyNone, false},
		{16, true, engine.BodyReplayable, false},
		{16, false, engine.BodyReplayable, false},
		{17, true, engine.BodyReopenable, true},
		{17, false, engine.BodyReopenable, true},
		{64, true, engine.BodyReopenable, true},
		{64, false, engine.BodyReopenable, true},
		{65, true, engine.BodyOneShot, false},
		{65, false, engine.BodyOneShot, true},
		{1000, false, engine.BodyOneShot, true},
	}
	for _, c := range cases {
		data := bytes.Repeat([]byte("abcdefgh"), c.size/8+1)[:c.size]
		cl := int64(-1)
		if c.known {
			cl = int64(c.size)
		}
		src := &countingReader{r: iotest.HalfReader(bytes.NewReader(data))}
		b, err := New(src, cl, Limits{Memory: lim.Memory, Spool: lim.Spool, Dir: t.TempDir()})
		if err != nil {
			t.Fatalf("size %d known %v: %v", c.size, c.known, err)
		}
		if b.BodyKind() != c.want {
			t.Errorf("size %d known %v: kind %v, want %v", c.size, c.known, b.BodyKind(), c.want)
		}
		if (b.Path() != "") != c.spooled {
			t.Errorf("size %d known %v: spooled file %q, want spooled %v", c.size, c.known, b.Path(), c.spooled)
		}
		if c.want == engine.BodyOneShot && c.known && src.n != 0 {
			t.Errorf("size %d: one-shot body of known length read %d bytes ahead", c.size, src.n)
		}
		got, err := io.ReadAll(b)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("size %d known %v: first read %q, %v", c.size, c.known, got, err)
		}
		if !b.Done() {
			t.Errorf("size %d: Done false after reading to EOF", c.size)
		}
		rc, err := b.Reopen()
		if c.want == engine.BodyOneShot {
			if !errors.Is(err, ErrNotReplayable) {
				t.Errorf("size %d: Reopen of one-shot: %v", c.size, err)
			}
		} else {
			if err != nil {
				t.Fatalf("size %d: Reopen: %v", c.size, err)
			}
			again, _ := io.ReadAll(rc)
			if !bytes.Equal(again, data) {
				t.Errorf("size %d: reopened body %q, want %q", c.size, again, data)
			}
		}
		path := b.Path()
		if err := b.Release(); err != nil {
			t.Errorf("size %d: Release: %v", c.size, err)
		}
		if path != "" {
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("size %d: spool file %s still there after Release: %v", c.size, path, err)
			}
		}
		if _, err := b.Read(make([]byte, 1)); !errors.Is(err, ErrClosed) {
			t.Errorf("size %d: Read after Release: %v", c.size, err)
		}
	}
}

func TestOneShotNotDoneUntilEOF(t *testing.T) {
	b, err := New(strings.NewReader(strings.Repeat("x", 100)), 100, lim)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Read(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if b.Done() {
		t.Fatal("one-shot body Done after a partial read")
	}
}

func TestShortBody(t *testing.T) {
	for _, cl := range []int64{10, 40} { // memory, then spool
		_, err := New(strings.NewReader("abc"), cl, Limits{Memory: 16, Spool: 64, Dir: t.TempDir()})
		if !errors.Is(err, ErrShortBody) {
			t.Errorf("cl %d: err %v, want ErrShortBody", cl, err)
		}
	}
}

func TestSpoolDirLeftEmpty(t *testing.T) {
	dir := t.TempDir()
	_, err := New(strings.NewReader("short"), 40, Limits{Memory: 16, Spool: 64, Dir: dir})
	if err == nil {
		t.Fatal("short spooled body accepted")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Fatalf("spool dir holds %d files after a failed spool", len(ents))
	}
}

func TestSpoolFileNeverVisible(t *testing.T) {
	dir := t.TempDir()
	b, err := New(strings.NewReader(strings.Repeat("s", 40)), 40, Limits{Memory: 16, Spool: 64, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	if b.BodyKind() != engine.BodyReopenable {
		t.Fatalf("kind %v", b.BodyKind())
	}
	// Nothing to leave behind even if the process dies now.
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("spool dir holds %d names while the body is alive", len(ents))
	}
	for range 2 {
		rc, err := b.Reopen()
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := io.ReadAll(rc); len(got) != 40 {
			t.Fatalf("reopened %d bytes", len(got))
		}
	}
}
