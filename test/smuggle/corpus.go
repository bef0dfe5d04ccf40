package smuggle

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// Case is one mutation of the corpus (testdata/cases.jsonl).
type Case struct {
	// ID names the case: family/source/technique[/shape].
	ID string `json:"id"`
	// Class is the class of trick (SECURITY.md lists them).
	Class string `json:"class"`
	// Origin names where the mutation comes from: repository, path,
	// license (or "egret" for the suite's own).
	Origin string `json:"origin"`
	// Raw is the request bytes, one JSON character per byte (U+0000 to
	// U+00FF), with the placeholders {{ABS}} (the scheme and authority of
	// an absolute-form target in explicit mode, nothing in transparent
	// mode) and {{HOST}} (the upstream's host:port). Only heads hold
	// placeholders, so Content-Length values stay right in both modes.
	Raw string `json:"raw"`
}

// Bytes returns the raw bytes of Raw (each rune is one byte).
func Latin1(s string) ([]byte, error) {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 0xff {
			return nil, fmt.Errorf("rune %U is not a byte", r)
		}
		b = append(b, byte(r))
	}
	return b, nil
}

// ToLatin1 is the inverse of Latin1: one rune per byte.
func ToLatin1(b []byte) string {
	r := make([]rune, len(b))
	for i, c := range b {
		r[i] = rune(c)
	}
	return string(r)
}

// Mode is how a client reaches the proxy.
type Mode string

const (
	Explicit    Mode = "explicit"    // HTTP_PROXY: absolute-form targets
	Transparent Mode = "transparent" // redirected: origin-form targets
)

// Expand gives the bytes a client sends for c in mode, to the upstream
// host (host:port), followed by the innocent request.
func (c *Case) Expand(mode Mode, host string) ([]byte, error) {
	b, err := Latin1(c.Raw)
	if err != nil {
		return nil, fmt.Errorf("case %s: %w", c.ID, err)
	}
	abs := ""
	if mode == Explicit {
		abs = "http://" + host
	}
	b = bytes.ReplaceAll(b, []byte("{{ABS}}"), []byte(abs))
	b = bytes.ReplaceAll(b, []byte("{{HOST}}"), []byte(host))
	return append(b, Innocent(mode, host)...), nil
}

// InnocentPath is the target of the innocent request that follows every
// case on its connection.
const InnocentPath = "/innocent"

// Innocent is a plain GET that follows each case on the same connection:
// whatever the case left in a parser's buffer shows in what happens to it.
func Innocent(mode Mode, host string) []byte {
	abs := ""
	if mode == Explicit {
		abs = "http://" + host
	}
	return []byte("GET " + abs + InnocentPath + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
}

// LoadCases reads a JSON-lines corpus.
func LoadCases(path string) ([]Case, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var cases []Case
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var c Case
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if c.ID == "" || c.Origin == "" || c.Class == "" || c.Raw == "" {
			return nil, fmt.Errorf("%s:%d: a case needs id, class, origin and raw", path, n)
		}
		if seen[c.ID] {
			return nil, fmt.Errorf("%s:%d: case %s twice", path, n, c.ID)
		}
		seen[c.ID] = true
		cases = append(cases, c)
	}
	return cases, sc.Err()
}
