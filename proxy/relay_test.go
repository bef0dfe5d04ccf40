package proxy

import (
	"bufio"
	"bytes"
	"net/http"
	"net/textproto"
	"reflect"
	"strings"
	"testing"
)

// TestWriteRelayedHeader: the relayed fields are what http.Header.WriteSubset
// writes with the hop-by-hop fields, the Proxy-* fields, the fields a
// Connection field names and the proxy's own excluded.
func TestWriteRelayedHeader(t *testing.T) {
	for _, h := range []http.Header{
		{},
		{"Content-Type": {"text/plain"}, "Content-Length": {"2"}, "Date": {"x"}},
		{"Connection": {"keep-alive"}, "Keep-Alive": {"timeout=5"}, "X-A": {"1", "2"}, "Server": {"s"}},
		{"Connection": {"x-secret, close", " X-Other "}, "X-Secret": {"s"}, "X-Other": {"o"}, "X-Kept": {"k"}},
		{"Proxy-Authenticate": {"Basic"}, "Proxy-Foo": {"f"}, "Te": {"t"}, "Trailer": {"X"}, "Transfer-Encoding": {"chunked"},
			"Upgrade": {"h2c"}, HeaderTimeoutMs: {"5"}, HeaderRequestID: {"up"}, HeaderAttempts: {"9"}, HeaderOutcome: {"ambiguous"}},
		{"X-Newline": {"a\r\nb", " c\n"}, "Bad Name": {"v"}, "X-Space": {"  padded\t "}, "Set-Cookie": {"a=1", "b=2"}},
		{"X-Many-1": {"1"}, "X-Many-2": {"2"}, "X-Many-3": {"3"}, "X-Many-4": {"4"}, "X-Many-5": {"5"}, "X-Many-6": {"6"},
			"X-Many-7": {"7"}, "X-Many-8": {"8"}, "X-Many-9": {"9"}, "X-Many-10": {"10"}, "X-Many-11": {"11"}, "X-Many-12": {"12"},
			"X-Many-13": {"13"}, "X-Many-14": {"14"}, "X-Many-15": {"15"}, "X-Many-16": {"16"}, "X-Many-17": {"17"}, "X-Many-18": {"18"},
			"X-Many-19": {"19"}, "X-Many-20": {"20"}, "X-Many-21": {"21"}, "X-Many-22": {"22"}, "X-Many-23": {"23"}, "X-Many-24": {"24"},
			"X-Many-25": {"25"}, "X-Many-26": {"26"}, "X-Many-27": {"27"}, "X-Many-28": {"28"}, "X-Many-29": {"29"}, "X-Many-30": {"30"},
			"X-Many-31": {"31"}, "X-Many-32": {"32"}, "X-Many-33": {"33"}, "X-Many-34": {"34"}},
	} {
		ex := map[string]bool{}
		for k := range relayExcludeBase {
			ex[k] = true
		}
		for k := range h {
			if strings.HasPrefix(k, "Proxy-") {
				ex[k] = true
			}
		}
		for _, v := range h["Connection"] {
			for f := range strings.SplitSeq(v, ",") {
				if f = textproto.TrimString(f); f != "" {
					ex[textproto.CanonicalMIMEHeaderKey(f)] = true
				}
			}
		}
		var want, got bytes.Buffer
		h.WriteSubset(&want, ex)
		w := bufio.NewWriter(&got)
		writeRelayedHeader(w, h)
		w.Flush()
		if got.String() != want.String() {
			t.Errorf("%v:\n got %q\nwant %q", h, got.String(), want.String())
		}
	}
}

func TestRemoveHopHeaders(t *testing.T) {
	h := http.Header{
		"Connection": {"keep-alive, x-named", "Upgrade"}, "Keep-Alive": {"1"}, "X-Named": {"n"},
		"Proxy-Connection": {"p"}, "Proxy-Authorization": {"a"}, "Te": {"trailers"}, "Trailer": {"t"},
		"Transfer-Encoding": {"chunked"}, "Upgrade": {"ws"}, HeaderTimeoutMs: {"5"},
		"Accept": {"*/*"}, "X-Kept": {"k"}, "Proxyish": {"kept"},
	}
	removeHopHeaders(h)
	want := http.Header{"Accept": {"*/*"}, "X-Kept": {"k"}, "Proxyish": {"kept"}}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("left %v, want %v", h, want)
	}
}
