package h1

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestSized(t *testing.T) {
	// Exactly n bytes, EOF with the last of them, the rest left unread.
	r := strings.NewReader("helloNEXT")
	b := NewSized(r, 5)
	p := make([]byte, 16)
	n, err := b.Read(p)
	if n != 5 || err != io.EOF || string(p[:n]) != "hello" || b.Remaining() != 0 {
		t.Fatalf("read %q, %v", p[:n], err)
	}
	if n, err := b.Read(p); n != 0 || err != io.EOF {
		t.Fatalf("after the end: %d %v", n, err)
	}
	if rest, _ := io.ReadAll(r); string(rest) != "NEXT" {
		t.Fatalf("rest %q", rest)
	}
	// Byte by byte, and a stream cut short.
	got, err := io.ReadAll(NewSized(iotest.OneByteReader(strings.NewReader("abc")), 3))
	if string(got) != "abc" || err != nil {
		t.Fatalf("one byte at a time: %q %v", got, err)
	}
	_, err = io.ReadAll(NewSized(strings.NewReader("ab"), 3))
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short: %v", err)
	}
	if err := iotest.TestReader(NewSized(strings.NewReader("0123456789xyz"), 10), []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
}
