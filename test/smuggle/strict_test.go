package smuggle

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
)

func TestStrictParserTakes(t *testing.T) {
	for _, c := range []struct {
		name, raw string
		method    string
		body      string
		close     bool
	}{
		{"get", "GET /a HTTP/1.1\r\nHost: h\r\n\r\n", "GET", "", false},
		{"absolute", "GET http://h/a HTTP/1.1\r\nHost: h\r\n\r\n", "GET", "", false},
		{"length", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello", "POST", "hello", false},
		{"chunked", "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2;a=\"b;c\"\r\nhe\r\n3 ; x\r\nllo\r\n0\r\nX: 1\r\n\r\n", "POST", "hello", false},
		{"close", "GET /a HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, close\r\n\r\n", "GET", "", true},
		{"http1.0", "GET /a HTTP/1.0\r\n\r\n", "GET", "", true},
		{"http1.0 keep-alive", "GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", "GET", "", false},
		{"obs-text value", "GET /a HTTP/1.1\r\nHost: h\r\nX: \xe9t\xe9\r\n\r\n", "GET", "", false},
		{"options asterisk", "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", "OPTIONS", "", false},
	} {
		r, n, err := ParseRequest([]byte(c.raw))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if n != len(c.raw) || r.Method != c.method || string(r.Body) != c.body || r.Close != c.close {
			t.Errorf("%s: took %d of %d bytes, %s body %q close %v", c.name, n, len(c.raw), r.Method, r.Body, r.Close)
		}
	}
}

func TestStrictParserRefuses(t *testing.T) {
	const ok = "GET /a HTTP/1.1\r\nHost: h\r\n"
	for name, raw := range map[string]string{
		"leading crlf":       "\r\n" + ok + "\r\n",
		"bare lf line":       "GET /a HTTP/1.1\nHost: h\r\n\r\n",
		"bare cr":            "GET /a HTTP/1.1\r\nHost: h\rX: y\r\n\r\n",
		"two spaces":         "GET  /a HTTP/1.1\r\nHost: h\r\n\r\n",
		"version 1.2":        "GET /a HTTP/1.2\r\nHost: h\r\n\r\n",
		"lower version":      "GET /a http/1.1\r\nHost: h\r\n\r\n",
		"method not token":   "G(T /a HTTP/1.1\r\nHost: h\r\n\r\n",
		"target byte":        "GET /\xe9 HTTP/1.1\r\nHost: h\r\n\r\n",
		"fragment":           "GET /a#b HTTP/1.1\r\nHost: h\r\n\r\n",
		"asterisk get":       "GET * HTTP/1.1\r\nHost: h\r\n\r\n",
		"no host":            "GET /a HTTP/1.1\r\n\r\n",
		"two hosts":          ok + "Host: i\r\n\r\n",
		"obs-fold":           ok + "X: a\r\n b\r\n\r\n",
		"space before colon": ok + "X : a\r\n\r\n",
		"no colon":           ok + "X\r\n\r\n",
		"empty name":         ok + ": a\r\n\r\n",
		"nul in value":       ok + "X: a\x00b\r\n\r\n",
		"cl and te":          ok + "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"two cl equal":       ok + "Content-Length: 1\r\nContent-Length: 1\r\n\r\nx",
		"cl list":            ok + "Content-Length: 1, 1\r\n\r\nx",
		"cl plus":            ok + "Content-Length: +1\r\n\r\nx",
		"cl empty":           ok + "Content-Length: \r\n\r\n",
		"te list":            ok + "Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
		"te identity":        ok + "Transfer-Encoding: identity\r\n\r\n",
		"two te":             ok + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"te in 1.0":          "POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"chunk 0x":           ok + "Transfer-Encoding: chunked\r\n\r\n0x1\r\nx\r\n0\r\n\r\n",
		"chunk space":        ok + "Transfer-Encoding: chunked\r\n\r\n 1\r\nx\r\n0\r\n\r\n",
		"chunk overflow":     ok + "Transfer-Encoding: chunked\r\n\r\n10000000000000001\r\nx\r\n0\r\n\r\n",
		"chunk ext bare cr":  ok + "Transfer-Encoding: chunked\r\n\r\n1;a\rb\r\nx\r\n0\r\n\r\n",
		"chunk data no crlf": ok + "Transfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n0\r\n\r\n",
		"chunk bare lf":      ok + "Transfer-Encoding: chunked\r\n\r\n1\nx\r\n0\r\n\r\n",
		"trailer te":         ok + "Transfer-Encoding: chunked\r\n\r\n0\r\nTransfer-Encoding: chunked\r\n\r\n",
		"trailer bare lf":    ok + "Transfer-Encoding: chunked\r\n\r\n0\r\nX: 1\n\r\n",
	} {
		_, _, err := ParseRequest([]byte(raw))
		if !errors.Is(err, ErrStrict) {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
}

func TestStrictParserIncomplete(t *testing.T) {
	full := "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX: 1\r\n\r\n"
	for i := range len(full) {
		_, _, err := ParseRequest([]byte(full[:i]))
		if !errors.Is(err, ErrIncomplete) {
			t.Fatalf("%d of %d bytes: %v, want ErrIncomplete", i, len(full), err)
		}
	}
}

func TestParseStreamStopsAtClose(t *testing.T) {
	s := ParseStream([]byte("GET /a HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n"))
	if len(s.Requests) != 1 || !errors.Is(s.Err, ErrStrict) || !strings.HasPrefix(string(s.Rest), "GET /b") {
		t.Fatalf("%d requests, err %v, rest %q", len(s.Requests), s.Err, s.Rest)
	}
}

// TestJudge shows the verdicts on streams whose answer is known: the judge
// can fail.
func TestJudge(t *testing.T) {
	const id = "0123456789abcdef"
	fwd := func(target string) Logged {
		return Logged{ID: id, Method: "GET", URL: "http://h" + target, Attempts: 1, Outcome: "relayed", Status: 200}
	}
	req := func(target, extra string) string {
		return "GET " + target + " HTTP/1.1\r\nHost: h\r\n" + extra + "Egret-Request-Id: " + id + "\r\n\r\n"
	}
	client := []byte("GET http://h/a HTTP/1.1\r\nHost: h\r\n\r\n")
	for _, c := range []struct {
		name  string
		logs  []Logged
		conns []string
		pass  bool
		want  string
	}{
		{"as logged", []Logged{fwd("/a")}, []string{req("/a", "")}, false, Forwarded},
		{"refused, nothing sent", []Logged{{ID: id, Outcome: "rejected", Status: 400}}, nil, false, Refused},
		{"a request egret did not log", []Logged{fwd("/a")}, []string{req("/a", "") + "GET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n"}, false, Desync},
		{"another target", []Logged{fwd("/a")}, []string{req("/b", "")}, false, Desync},
		{"left inside a request", []Logged{fwd("/a")}, []string{req("/a", "") + "GET /x HTT"}, false, Desync},
		{"unframeable", []Logged{fwd("/a")}, []string{"GET /a HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"}, false, Desync},
		{"logged relayed, never sent", []Logged{fwd("/a")}, nil, false, Desync},
		{"more arrivals than attempts", []Logged{fwd("/a")}, []string{req("/a", ""), req("/a", "")}, false, Desync},
		{"forged egret field", []Logged{fwd("/a")}, []string{req("/a", "Egret-Outcome: relayed\r\n")}, false, Desync},
		{"forged request id", []Logged{fwd("/a")}, []string{"GET /a HTTP/1.1\r\nHost: h\r\nEgret-Request-Id: forged\r\n\r\n"}, false, Desync},
		{"declared pipe, exact", []Logged{{ID: id, Method: "GET", URL: "http://h/a", Attempts: 1, Outcome: "forward_proxy"}}, []string{string(client)}, false, Piped},
		{"declared pipe, altered", []Logged{{ID: id, Method: "GET", URL: "http://h/a", Attempts: 1, Outcome: "forward_proxy"}}, []string{"GET http://h/a HTTP/1.1\r\nHost: i\r\n\r\n"}, false, Desync},
		{"passthrough, exact", nil, []string{string(client)}, true, Piped},
		{"upgrade is no pipe", []Logged{{ID: id, Method: "GET", URL: "http://h/a", Attempts: 1, Outcome: "upgrade"}}, []string{req("/a", "") + "GET /innocent HTTP/1.1\r\nHost: h\r\n\r\n"}, false, Desync},
	} {
		var conns [][]byte
		for _, s := range c.conns {
			conns = append(conns, []byte(s))
		}
		v := Judge(client, c.logs, conns, c.pass)
		if v.Class != c.want {
			t.Errorf("%s: %s %q, want %s", c.name, v.Class, v.Reasons, c.want)
		}
	}
}

// TestCorpus checks the corpus: every case names its origin, and the
// generator's output is what is committed.
func TestCorpus(t *testing.T) {
	cases, err := LoadCases(corpus)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(corpus)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not the generator's output: run go run ./test/smuggle/cmd/gen", corpus)
	}
	classes := map[string]int{}
	for _, c := range cases {
		classes[c.Class]++
		if !strings.Contains(c.Origin, "(") && c.Origin != "egret (issue 22)" {
			t.Errorf("%s: origin %q names no license", c.ID, c.Origin)
		}
	}
	for _, want := range []string{"te-obfuscation", "transfer-encoding", "content-length", "chunked-body", "field-name-value",
		"request-line", "absolute-form", "http1.0", "expect", "pipelining", "upgrade", "hop-by-hop", "egret-fields"} {
		if classes[want] == 0 {
			t.Errorf("no case of class %s", want)
		}
	}
	t.Logf("%d cases: %v", len(cases), classes)
}
