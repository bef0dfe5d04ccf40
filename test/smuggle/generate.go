package smuggle

// The corpus generator: testdata/cases.jsonl is Generate's output (go run
// ./test/smuggle/cmd/gen writes it; TestCorpus checks that it is). The
// mutation lists of public smuggling and parser-discrepancy suites are
// re-expressed here as data (no code of theirs):
//
//   - defparam/smuggler (MIT), configs/default.py, exhaustive.py,
//     doubles.py at 2be871e6151ce85167a277fab21c74c851d8b20b: the
//     Transfer-Encoding header gadgets (named ones and byte loops);
//   - PortSwigger/http-request-smuggler (Apache-2.0),
//     src/burp/DesyncBox.java at a25814d258c501b59b7f561d816f4d787c61ab70:
//     the HTTP/1 Transfer-Encoding and Content-Length permutations;
//   - narfindustries/http-garden (GPL-3.0), TROPHIES.md and
//     tools/mutations.py at ffb9164c6603f6201c1dc70afb08fd229e2778bc: the
//     classes of parser discrepancy it found (chunk sizes, lengths, field
//     names and values, request lines); only the classes are taken, each
//     case's bytes are written here;
//   - the suite's own cases for what issue 22 names besides (absolute-form
//     vs Host, HTTP/1.0, Expect, pipelining, Upgrade, hop-by-hop framing,
//     egret's own fields), origin "egret (issue 22)".
//
// Each Transfer-Encoding gadget is put into a request whose two readings
// differ: CL.TE (a Content-Length covering a chunked body that ends early
// and hides a request) or TE.CL (a chunk that holds a request, a
// Content-Length that ends inside the size line).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

const (
	originSmuggler = "defparam/smuggler@2be871e configs/%s (MIT)"
	originBurp     = "PortSwigger/http-request-smuggler@a25814d src/burp/DesyncBox.java (Apache-2.0)"
	originGarden   = "class from narfindustries/http-garden@ffb9164 TROPHIES.md (GPL-3.0); bytes written for egret"
	originEgret    = "egret (issue 22)"
)

type gen struct {
	cases []Case
	seen  map[string]string // raw -> id
	ids   map[string]bool
}

func (g *gen) add(id, class, origin string, raw []byte) {
	if g.ids[id] {
		panic("case " + id + " twice")
	}
	key := string(raw)
	if _, dup := g.seen[key]; dup {
		return // the same bytes under another name: keep the first
	}
	g.seen[key] = id
	g.ids[id] = true
	g.cases = append(g.cases, Case{ID: id, Class: class, Origin: origin, Raw: ToLatin1(raw)})
}

// The request a smuggled reading would reveal.
const hidden = "GET /smuggled HTTP/1.1\r\nHost: smuggled.invalid\r\n\r\n"

// clte: Content-Length covers a chunked body whose last chunk comes first:
// a reader of the chunks sees a request after it.
func clte(path, gadget string) []byte {
	body := "0\r\n\r\n" + hidden
	return []byte("POST {{ABS}}" + path + " HTTP/1.1\r\n" + gadget + "\r\nHost: {{HOST}}\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

// tecl: a chunk holds a request; Content-Length ends inside the size line,
// so a reader of the length sees the chunk's data as the next request.
func tecl(path, gadget string) []byte {
	inner := "GPOST /smuggled HTTP/1.1\r\nHost: smuggled.invalid\r\nContent-Length: 3\r\n\r\nx=1"
	size := strconv.FormatInt(int64(len(inner)), 16)
	body := size + "\r\n" + inner + "\r\n0\r\n\r\n"
	return []byte("POST {{ABS}}" + path + " HTTP/1.1\r\n" + gadget + "\r\nHost: {{HOST}}\r\nContent-Length: " +
		strconv.Itoa(len(size)+2) + "\r\n\r\n" + body)
}

func (g *gen) teGadget(id, class, origin, gadget string, shapes ...string) {
	for _, s := range shapes {
		switch s {
		case "clte":
			g.add(id+"/clte", class, origin, clte("/clte", gadget))
		case "tecl":
			g.add(id+"/tecl", class, origin, tecl("/tecl", gadget))
		}
	}
}

// smuggler: defparam/smuggler's gadgets. The byte loops alternate the two
// shapes (the corpus stays near 2,000 cases); the named gadgets get both.
func (g *gen) smuggler() {
	const te = "Transfer-Encoding"
	named := []struct{ name, gadget string }{
		{"nameprefix1", " " + te + ": chunked"},
		{"tabprefix1", te + ":\tchunked"},
		{"tabprefix2", te + "\t:\tchunked"},
		{"spacejoin1", "Transfer Encoding: chunked"},
		{"underjoin1", "Transfer_Encoding: chunked"},
		{"smashed", "Transfer Encoding:chunked"},
		{"space1", te + " : chunked"},
		{"valueprefix1", te + ":  chunked"},
		{"vertprefix1", te + ":\x0bchunked"},
		{"commaCow", te + ": chunked, cow"},
		{"cowComma", te + ": cow, chunked"},
		{"contentEnc", "Content-Encoding: chunked"},
		{"linewrapped1", te + ":\n chunked"},
		{"quoted", te + ": \"chunked\""},
		{"aposed", te + ": 'chunked'"},
		{"lazygrep", te + ": chunk"},
		{"sarcasm", "TrAnSFer-EnCODinG: cHuNkeD"},
		{"yelling", "TRANSFER-ENCODING: CHUNKED"},
		{"0dsuffix", te + ": chunked\r"},
		{"tabsuffix", te + ": chunked\t"},
		{"revdualchunk", te + ": cow\r\n" + te + ": chunked"},
		{"0dspam", "Transfer\r-Encoding: chunked"},
		{"nested", te + ": cow chunked bar"},
		{"spaceFF", te + ":\xffchunked"},
		{"accentCH", te + ": ch\x96nked"},
		{"accentTE", "Transf\x82r-Encoding: chunked"},
		{"x-rout", "X:X\r" + te + ": chunked"},
		{"x-nout", "X:X\n" + te + ": chunked"},
	}
	for _, n := range named {
		g.teGadget("smuggler/exhaustive/"+n.name, "te-obfuscation", fmt.Sprintf(originSmuggler, "exhaustive.py"), n.gadget, "clte", "tecl")
	}
	var bytesLoop []int
	for i := 0x1; i < 0x20; i++ {
		bytesLoop = append(bytesLoop, i)
	}
	for i := 0x7f; i < 0x100; i++ {
		bytesLoop = append(bytesLoop, i)
	}
	shape := func(i int) string { return []string{"clte", "tecl"}[i%2] }
	k := 0
	for _, i := range bytesLoop {
		c := string([]byte{byte(i)})
		for _, p := range []struct{ name, gadget string }{
			{"midspace", te + ":" + c + "chunked"},
			{"postspace", te + c + ": chunked"},
			{"prespace", c + te + ": chunked"},
			{"endspace", te + ": chunked" + c},
		} {
			g.teGadget(fmt.Sprintf("smuggler/exhaustive/%s-%02x", p.name, i), "te-obfuscation", fmt.Sprintf(originSmuggler, "exhaustive.py"), p.gadget, shape(k))
			k++
		}
	}
	for _, i := range []int{0x1, 0x4, 0x8, 0x9, 0xa, 0xb, 0xc, 0xd, 0x1f, 0x20, 0x7f, 0xa0, 0xff} {
		c := string([]byte{byte(i)})
		for _, p := range []struct{ name, gadget string }{
			{"xprespace", "X: X" + c + te + ": chunked"},
			{"endspacex", te + ": chunked" + c + "X: X"},
			{"rxprespace", "X: X\r" + c + te + ": chunked"},
			{"xnprespace", "X: X" + c + "\n" + te + ": chunked"},
			{"endspacerx", te + ": chunked\r" + c + "X: X"},
			{"endspacexn", te + ": chunked" + c + "\nX: X"},
		} {
			g.teGadget(fmt.Sprintf("smuggler/default/%s-%02x", p.name, i), "te-obfuscation", fmt.Sprintf(originSmuggler, "default.py"), p.gadget, shape(k))
			k++
		}
	}
	var doubles []int
	for i := 0x1; i <= 0x20; i++ {
		doubles = append(doubles, i)
	}
	for i := 0x7f; i < 0x100; i++ {
		doubles = append(doubles, i)
	}
	for _, i := range doubles {
		c := string([]byte{byte(i)})
		x := fmt.Sprintf("%02x", i)
		for _, p := range []struct{ name, gadget string }{
			{x + "-" + x + "-XX-XX", c + te + c + ": chunked"},
			{x + "-XX-" + x + "-XX", c + te + ":" + c + "chunked"},
			{x + "-XX-XX-" + x, c + te + ": chunked" + c},
			{"XX-" + x + "-" + x + "-XX", te + c + ":" + c + "chunked"},
			{"XX-" + x + "-XX-" + x, te + c + ": chunked" + c},
			{"XX-XX-" + x + "-" + x, te + ":" + c + "chunked" + c},
		} {
			g.teGadget("smuggler/doubles/"+p.name, "te-obfuscation", fmt.Sprintf(originSmuggler, "doubles.py"), p.gadget, shape(k))
			k++
		}
	}
}

// burp: PortSwigger's HTTP/1 permutations of Transfer-Encoding (both
// shapes) and Content-Length.
func (g *gen) burp() {
	const h, v = "Transfer-Encoding: ", "chunked"
	tev := h + v
	special := []int{0, 9, 11, 12, 13, 127}
	type perm struct{ name, gadget string }
	perms := []perm{
		{"vanilla", tev},
		{"underjoin1", "Transfer_Encoding: " + v},
		{"spacejoin1", "Transfer Encoding: " + v},
		{"space1", "Transfer-Encoding : " + v},
		{"nameprefix1", "Foo: bar\r\n " + tev},
		{"nameprefix2", "Foo: bar\r\n\t" + tev},
		{"valueprefix1", h + " " + v},
		{"nospace1", "Transfer-Encoding:" + v},
		{"linewrapped1", "Transfer-Encoding:\n " + v},
		{"doublewrapped", "Transfer-Encoding:\r\n \r\n " + v},
		{"gareth1", "Transfer-Encoding\n : " + v},
		{"badsetupCR", "Foo: bar\r" + tev},
		{"badsetupLF", "Foo: bar\n" + tev},
		{"vertwrap", h + "\n\x0b" + v},
		{"tabwrap", h + "\r\n\t" + v},
		{"multiCase", "tRANSFER-ENCODING: " + v},
		{"UPPERCASE", "TRANSFER-ENCODING: " + v},
		{"0dwrap", "Foo: bar\r\n\r" + tev},
		{"0dspam", "Tra\rnsfer-Encoding: " + v},
		{"connection", "Connection: Transfer-Encoding\r\n" + tev},
		{"spjunk", "Transfer-Encoding x: " + v},
		{"backslash", "Transfer\\Encoding: " + v},
		{"nel", "Transfer-Encoding\xc2\x85: " + v},
		{"nbsp", "Transfer-Encoding\xc2\xa0: " + v},
		{"shy2", "Transfer-Encoding\xc2\xad: " + v},
		{"shy", "Transfer\xc2\xadEncoding: " + v},
		{"spaceFF", "Transfer-Encoding:\xff" + v},
		{"unispace", "Transfer-Encoding:\xa0" + v},
		{"0dsuffix", tev + "\r"},
		{"tabsuffix", tev + "\t"},
		{"removed", "Nothing-interesting: 1"},
		{"commaCow", tev + ", identity"},
		{"cowComma", h + "identity, " + v},
		{"contentEnc", "Content-Encoding: " + v},
		{"quoted", h + "\"chunked\""},
		{"aposed", h + "'chunked'"},
		{"dualchunk", tev + "\r\nTransfer-encoding: identity"},
		{"lazygrep", h + "chunk"},
		{"revdualchunk", h + "identity\r\n" + tev},
		{"bodysplit", "X: y\r\nFoo: barn\n\n" + tev},
		{"nested", h + "identity, chunked, identity"},
		{"encode", "Transfer-%45ncoding: " + v},
		{"h2colon", "Transfer-Encoding`chunked : " + v},
		{"h2space", "Transfer-Encoding chunked : " + v},
		{"h2prefix", ":transfer-encoding: " + v},
		{"http2case", "x-reject: 1\r\ntransfer-Encoding: " + v},
		{"qencode", h + "=?iso-8859-1?B?Y2h1bmtlZA==?="},
		{"qencodeutf", h + "=?UTF-8?B?Y2h1bmtlZA==?="},
		{"accentTE", "Transf\x82r-Encoding: " + v},
		{"accentCH", h + "ch\x96nked"},
	}
	for _, i := range special {
		c := string([]byte{byte(i)})
		perms = append(perms,
			perm{fmt.Sprintf("spacefix1:%d", i), "Transfer-Encoding:" + c + v},
			perm{fmt.Sprintf("prefix1:%d", i), h + c + v},
			perm{fmt.Sprintf("suffix1:%d", i), tev + c},
			perm{fmt.Sprintf("namesuffix1:%d", i), "Transfer-Encoding" + c + ": " + v},
		)
	}
	for _, p := range perms {
		g.teGadget("burp/te/"+p.name, "te-obfuscation", originBurp, p.gadget, "clte", "tecl")
	}
	// Method and version permutations of the vanilla CL.TE request.
	for _, m := range []string{"GET", "OPTIONS", "HEAD"} {
		raw := clte("/clte", tev)
		g.add("burp/te/"+strings.ToLower(m), "te-obfuscation", originBurp, append([]byte(m), raw[len("POST"):]...))
	}
	g.add("burp/te/http1.0", "http1.0", originBurp, bytes.Replace(clte("/clte", tev), []byte("HTTP/1.1"), []byte("HTTP/1.0"), 1))
	g.add("burp/te/range", "te-obfuscation", originBurp, clte("/clte", tev+"\r\nRange: bytes=0-0"))

	// Content-Length permutations: the body is "x=1" then a hidden request,
	// so that a reader that takes another length than 3 sees other bytes.
	clReq := func(value string, extra string) []byte {
		return []byte("POST {{ABS}}/cl HTTP/1.1\r\nHost: {{HOST}}\r\n" + extra + "Content-Length: " + value + "\r\n\r\nx=1" + hidden)
	}
	for _, p := range []struct{ name, value, extra string }{
		{"CL-plus", "+3", ""},
		{"CL-minus", "-3", ""},
		{"CL-pad", "03", ""},
		{"CL-bigpad", "000000000003", ""},
		{"CL-spacepad", "0 3", ""},
		{"CL-e", "3e0", ""},
		{"CL-dec", "3.0", ""},
		{"CL-commaprefix", "0, 3", ""},
		{"CL-commasuffix", "3, 0", ""},
		{"CL-expect", "3", "Expect: 100-continue\r\n"},
		{"CL-expect-obfs", "3", "Expect: x 100-continue\r\n"},
		{"CL-error", "3", "X-Invalid Y: \r\n"},
	} {
		g.add("burp/cl/"+p.name, "content-length", originBurp, clReq(p.value, p.extra))
	}
}

// garden: classes of discrepancy the HTTP Garden found, each as requests of
// our own.
func (g *gen) garden() {
	chunkedReq := func(body string) []byte {
		return []byte("POST {{ABS}}/chunk HTTP/1.1\r\nHost: {{HOST}}\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
	}
	for _, c := range []struct{ name, body string }{
		{"size-0x", "0x5\r\nhello\r\n0\r\n\r\n"},
		{"size-plus", "+5\r\nhello\r\n0\r\n\r\n"},
		{"size-minus", "-5\r\nhello\r\n0\r\n\r\n"},
		{"size-underscore", "0_5\r\nhello\r\n0\r\n\r\n"},
		{"size-leading-space", " 5\r\nhello\r\n0\r\n\r\n"},
		{"size-leading-tab", "\t5\r\nhello\r\n0\r\n\r\n"},
		{"size-trailing-space", "5 \r\nhello\r\n0\r\n\r\n"},
		{"size-empty", "\r\nhello\r\n0\r\n\r\n"},
		{"size-prefix", "5g\r\nhello\r\n0\r\n\r\n"},
		{"size-leading-zeros", "0000000000000005\r\nhello\r\n0\r\n\r\n"},
		{"size-overflow-64", "10000000000000005\r\nhello\r\n0\r\n\r\n"},
		{"size-overflow-ffff", "ffffffffffffffff5\r\nhello\r\n0\r\n\r\n"},
		{"size-huge", "fffffffffffffff\r\nhello\r\n0\r\n\r\n"},
		{"size-uppercase", "A\r\nhellohello\r\n0\r\n\r\n"},
		{"ext-plain", "5;a=b\r\nhello\r\n0\r\n\r\n"},
		{"ext-quoted", "5;a=\"b c\"\r\nhello\r\n0\r\n\r\n"},
		{"ext-bws", "5 ; a = b\r\nhello\r\n0\r\n\r\n"},
		{"ext-bare-cr", "5;a\rb\r\nhello\r\n0\r\n\r\n"},
		{"ext-bare-lf", "5;a\nb\r\nhello\r\n0\r\n\r\n"},
		{"ext-cr-before-semicolon", "5\r;a\r\nhello\r\n0\r\n\r\n"},
		{"ext-nul", "5;a\x00\r\nhello\r\n0\r\n\r\n"},
		{"ext-unterminated-quote", "5;a=\"b\r\nhello\r\n0\r\n\r\n"},
		{"ext-empty-name", "5;=b\r\nhello\r\n0\r\n\r\n"},
		{"ext-huge", "5;" + strings.Repeat("a", 8192) + "\r\nhello\r\n0\r\n\r\n"},
		{"line-bare-lf", "5\nhello\r\n0\r\n\r\n"},
		{"data-bare-lf", "5\r\nhello\n0\r\n\r\n"},
		{"all-bare-lf", "5\nhello\n0\n\n"},
		{"data-cr-x", "5\r\nhello\rX0\r\n\r\n"},
		{"data-crlf-missing", "5\r\nhello0\r\n\r\n"},
		{"data-extra-byte", "5\r\nhellox\r\n0\r\n\r\n"},
		{"data-short", "6\r\nhello\r\n0\r\n\r\n"},
		{"data-any-two-bytes", "5\r\nhelloXX0\r\n\r\n"},
		{"extra-crlf-before-last", "5\r\nhello\r\n\r\n0\r\n\r\n"},
		{"last-00", "5\r\nhello\r\n00\r\n\r\n"},
		{"last-ext", "5\r\nhello\r\n0;a=b\r\n\r\n"},
		{"last-no-final-crlf", "5\r\nhello\r\n0\r\n"},
		{"last-bare-lf-end", "5\r\nhello\r\n0\r\n\n"},
		{"trailer", "5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n"},
		{"trailer-bare-lf", "5\r\nhello\r\n0\r\nX-Trailer: 1\n\r\n"},
		{"trailer-te", "5\r\nhello\r\n0\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{"trailer-cl", "5\r\nhello\r\n0\r\nContent-Length: 5\r\n\r\n"},
		{"trailer-fold", "5\r\nhello\r\n0\r\nX-Trailer: 1\r\n 2\r\n\r\n"},
		{"trailer-no-colon", "5\r\nhello\r\n0\r\nX-Trailer\r\n\r\n"},
		{"trailer-nul", "5\r\nhello\r\n0\r\nX-Trailer: \x001\r\n\r\n"},
		{"trailer-request", "5\r\nhello\r\n0\r\n" + strings.TrimSuffix(hidden, "\r\n")},
		{"body-then-request", "5\r\nhello\r\n0\r\n\r\n" + hidden},
		{"zero-then-data", "0\r\n\r\nhello"},
		{"chunk-holds-request", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(hidden), hidden)},
	} {
		g.add("garden/chunk/"+c.name, "chunked-body", originGarden, chunkedReq(c.body))
	}

	clReq := func(fields string) []byte {
		return []byte("POST {{ABS}}/len HTTP/1.1\r\nHost: {{HOST}}\r\n" + fields + "\r\nhello" + hidden)
	}
	for _, c := range []struct{ name, fields string }{
		{"empty", "Content-Length: \r\n"},
		{"space", "Content-Length:  \r\n"},
		{"plus", "Content-Length: +5\r\n"},
		{"minus", "Content-Length: -5\r\n"},
		{"negative-one", "Content-Length: -1\r\n"},
		{"hex", "Content-Length: 0x5\r\n"},
		{"octal-like", "Content-Length: 05\r\n"},
		{"underscore", "Content-Length: 0_5\r\n"},
		{"prefix", "Content-Length: 5x\r\n"},
		{"inner-space", "Content-Length: 5 5\r\n"},
		{"list-equal", "Content-Length: 5, 5\r\n"},
		{"list-differ", "Content-Length: 5, 6\r\n"},
		{"list-empty-member", "Content-Length: ,5\r\n"},
		{"two-equal", "Content-Length: 5\r\nContent-Length: 5\r\n"},
		{"two-differ", "Content-Length: 5\r\nContent-Length: 60\r\n"},
		{"two-differ-rev", "Content-Length: 60\r\nContent-Length: 5\r\n"},
		{"empty-then-real", "Content-Length: \r\nContent-Length: 5\r\n"},
		{"real-then-empty", "Content-Length: 5\r\nContent-Length: \r\n"},
		{"overflow", "Content-Length: 18446744073709551621\r\n"},
		{"huge", "Content-Length: 99999999999999999999999\r\n"},
		{"nul", "Content-Length: 5\x00\r\n"},
		{"tab", "Content-Length:\t5\r\n"},
		{"vtab", "Content-Length:\x0b5\r\n"},
		{"name-space", "Content-Length : 5\r\n"},
		{"name-tab", "Content-Length\t: 5\r\n"},
		{"lower", "content-length: 5\r\n"},
		{"cl-te", "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"},
		{"te-cl", "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"},
		{"cl-te-identity", "Content-Length: 5\r\nTransfer-Encoding: identity\r\n"},
		{"cl-te-unknown", "Content-Length: 5\r\nTransfer-Encoding: cow\r\n"},
		{"nbsp-value", "Content-Length: \xa05\r\n"},
		{"nel-value", "Content-Length: 5\x85\r\n"},
		{"fold", "Content-Length:\r\n 5\r\n"},
	} {
		g.add("garden/length/"+c.name, "content-length", originGarden, clReq(c.fields))
	}

	teReq := func(fields, body string) []byte {
		return []byte("POST {{ABS}}/te HTTP/1.1\r\nHost: {{HOST}}\r\n" + fields + "\r\n" + body)
	}
	const chunkedHello = "5\r\nhello\r\n0\r\n\r\n"
	for _, c := range []struct{ name, fields string }{
		{"double-chunked-value", "Transfer-Encoding: chunked, chunked\r\n"},
		{"two-chunked-fields", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"},
		{"comma-chunked", "Transfer-Encoding: ,chunked\r\n"},
		{"chunked-comma", "Transfer-Encoding: chunked,\r\n"},
		{"identity", "Transfer-Encoding: identity\r\n"},
		{"gzip-chunked", "Transfer-Encoding: gzip, chunked\r\n"},
		{"chunked-gzip", "Transfer-Encoding: chunked, gzip\r\n"},
		{"chunked-param", "Transfer-Encoding: chunked;q=1\r\n"},
		{"xchunked", "Transfer-Encoding: xchunked\r\n"},
		{"unknown", "Transfer-Encoding: cow\r\n"},
		{"empty", "Transfer-Encoding: \r\n"},
		{"nbsp-strip", "Transfer-Encoding: \xa0chunked\r\n"},
		{"nel-strip", "Transfer-Encoding: chunked\x85\r\n"},
		{"upper-chunked", "Transfer-Encoding: CHUNKED\r\n"},
		{"te-header", "TE: chunked\r\n"},
	} {
		g.add("garden/te/"+c.name, "transfer-encoding", originGarden, teReq(c.fields, chunkedHello))
	}
	g.add("garden/te/http1.0-chunked", "http1.0", originGarden,
		[]byte("POST {{ABS}}/te HTTP/1.0\r\nHost: {{HOST}}\r\nTransfer-Encoding: chunked\r\n\r\n"+chunkedHello))

	fieldReq := func(fields string) []byte {
		return []byte("GET {{ABS}}/field HTTP/1.1\r\nHost: {{HOST}}\r\n" + fields + "\r\n")
	}
	for _, c := range []struct{ name, fields string }{
		{"value-nul", "X-A: a\x00b\r\n"},
		{"value-cr", "X-A: a\rb\r\n"},
		{"value-bare-lf-line", "X-A: a\nX-B: b\r\n"},
		{"value-cr-then-cl", "X-A: a\rContent-Length: 5\r\n"},
		{"value-lf-then-cl", "X-A: a\nContent-Length: 5\r\n"},
		{"value-del", "X-A: a\x7fb\r\n"},
		{"value-high", "X-A: a\xffb\r\n"},
		{"value-nbsp-edges", "X-A: \xa0a\xa0\r\n"},
		{"name-empty", ": x\r\n"},
		{"name-no-colon", "X-A\r\n"},
		{"name-space-only", "X-A b\r\n"},
		{"name-space-before-colon", "X-A : b\r\n"},
		{"name-leading-space-first", " X-A: b\r\n"},
		{"name-high-byte", "X-\xe9: b\r\n"},
		{"name-nbsp-end", "X-A\xa0: b\r\n"},
		{"name-nel-end", "X-A\x85: b\r\n"},
		{"name-slash", "X/A: b\r\n"},
		{"name-at", "X@A: b\r\n"},
		{"name-continued", "X-\r\n A: b\r\n"},
		{"fold", "X-A: a\r\n b\r\n"},
		{"fold-tab", "X-A: a\r\n\tb\r\n"},
		{"end-cr-x", "X-A: a\r\n\rX"},
		{"many-fields", strings.Repeat("X-A: a\r\n", 150)},
		{"long-value", "X-A: " + strings.Repeat("a", 70000) + "\r\n"},
		{"host-two", "Host: other.invalid\r\n"},
		{"host-fold", "X-A: a\r\n Host: other.invalid\r\n"},
	} {
		g.add("garden/field/"+c.name, "field-name-value", originGarden, fieldReq(c.fields))
	}
	g.add("garden/field/host-missing", "field-name-value", originGarden, []byte("GET {{ABS}}/field HTTP/1.1\r\nX-A: a\r\n\r\n"))
	g.add("garden/field/host-empty", "field-name-value", originGarden, []byte("GET {{ABS}}/field HTTP/1.1\r\nHost:\r\n\r\n"))
	g.add("garden/field/host-space", "field-name-value", originGarden, []byte("GET {{ABS}}/field HTTP/1.1\r\nHost: a b\r\n\r\n"))
	g.add("garden/field/host-at", "field-name-value", originGarden, []byte("GET {{ABS}}/field HTTP/1.1\r\nHost: a@{{HOST}}\r\n\r\n"))

	lineReq := func(line string) []byte {
		return []byte(line + "\r\nHost: {{HOST}}\r\n\r\n")
	}
	for _, c := range []struct{ name, line string }{
		{"double-space", "GET  {{ABS}}/line HTTP/1.1"},
		{"tab-sep", "GET\t{{ABS}}/line HTTP/1.1"},
		{"lf-sep", "GET\n{{ABS}}/line HTTP/1.1"},
		{"trailing-space", "GET {{ABS}}/line HTTP/1.1 "},
		{"version-1.10", "GET {{ABS}}/line HTTP/1.10"},
		{"version-01.1", "GET {{ABS}}/line HTTP/01.1"},
		{"version-1.01", "GET {{ABS}}/line HTTP/1.01"},
		{"version-2.0", "GET {{ABS}}/line HTTP/2.0"},
		{"version-0.9", "GET {{ABS}}/line HTTP/0.9"},
		{"version-1.2", "GET {{ABS}}/line HTTP/1.2"},
		{"version-lower", "GET {{ABS}}/line http/1.1"},
		{"version-prefix", "GET {{ABS}}/line HTTP/1.1x"},
		{"version-overflow", "GET {{ABS}}/line HTTP/257.1"},
		{"version-missing", "GET {{ABS}}/line"},
		{"method-lower", "get {{ABS}}/line HTTP/1.1"},
		{"method-prefix", "GETX {{ABS}}/line HTTP/1.1"},
		{"method-nul", "G\x00ET {{ABS}}/line HTTP/1.1"},
		{"method-space", "GE T {{ABS}}/line HTTP/1.1"},
		{"method-high", "G\xc9T {{ABS}}/line HTTP/1.1"},
		{"method-long", strings.Repeat("A", 300) + " {{ABS}}/line HTTP/1.1"},
		{"target-fragment", "GET {{ABS}}/line#frag HTTP/1.1"},
		{"target-del", "GET {{ABS}}/li\x7fne HTTP/1.1"},
		{"target-high", "GET {{ABS}}/li\xe9ne HTTP/1.1"},
		{"target-nul", "GET {{ABS}}/li\x00ne HTTP/1.1"},
		{"target-double-slash", "GET {{ABS}}//line HTTP/1.1"},
		{"target-dotdot", "GET {{ABS}}/a/../line HTTP/1.1"},
		{"target-query-space", "GET {{ABS}}/line?a b HTTP/1.1"},
		{"target-long", "GET {{ABS}}/" + strings.Repeat("a", 70000) + " HTTP/1.1"},
		{"leading-crlf", "\r\nGET {{ABS}}/line HTTP/1.1"},
		{"leading-lf", "\nGET {{ABS}}/line HTTP/1.1"},
		{"leading-space", " GET {{ABS}}/line HTTP/1.1"},
		{"line-bare-lf", "GET {{ABS}}/line HTTP/1.1\n"},
		{"line-bare-cr", "GET {{ABS}}/line HTTP/1.1\rX: y"},
		{"asterisk-get", "GET * HTTP/1.1"},
		{"asterisk-options", "OPTIONS * HTTP/1.1"},
		{"origin-form", "GET /line HTTP/1.1"},
		{"authority-form-get", "GET {{HOST}} HTTP/1.1"},
	} {
		g.add("garden/line/"+c.name, "request-line", originGarden, lineReq(c.line))
	}
}

// own: the suite's cases for what issue 22 names besides.
func (g *gen) own() {
	add := func(class, name, raw string) { g.add("egret/"+class+"/"+name, class, originEgret, []byte(raw)) }
	body := func(method, path, fields, body string) string {
		return method + " {{ABS}}" + path + " HTTP/1.1\r\nHost: {{HOST}}\r\n" + fields + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}

	// Absolute-form against Host.
	add("absolute-form", "host-mismatch", "GET http://{{HOST}}/abs HTTP/1.1\r\nHost: other.invalid\r\n\r\n")
	add("absolute-form", "host-missing", "GET http://{{HOST}}/abs HTTP/1.1\r\n\r\n")
	add("absolute-form", "host-userinfo", "GET http://user:pass@{{HOST}}/abs HTTP/1.1\r\nHost: {{HOST}}\r\n\r\n")
	add("absolute-form", "scheme-upper", "GET HTTP://{{HOST}}/abs HTTP/1.1\r\nHost: {{HOST}}\r\n\r\n")
	add("absolute-form", "no-path", "GET http://{{HOST}} HTTP/1.1\r\nHost: {{HOST}}\r\n\r\n")
	add("absolute-form", "query-only", "GET http://{{HOST}}?a=b HTTP/1.1\r\nHost: {{HOST}}\r\n\r\n")
	add("absolute-form", "fragment", "GET http://{{HOST}}/abs#f HTTP/1.1\r\nHost: {{HOST}}\r\n\r\n")
	add("absolute-form", "host-two", "GET http://{{HOST}}/abs HTTP/1.1\r\nHost: {{HOST}}\r\nHost: other.invalid\r\n\r\n")
	add("absolute-form", "origin-then-absolute", "GET /abs HTTP/1.1\r\nHost: {{HOST}}\r\n\r\nGET http://{{HOST}}/abs2 HTTP/1.1\r\nHost: {{HOST}}\r\n\r\n")
	add("absolute-form", "absolute-with-cl-body", body("POST", "/abs", "", "GET /smuggled HTTP/1.1\r\nHost: smuggled.invalid\r\n\r\n"))

	// HTTP/1.0.
	add("http1.0", "get-no-host", "GET {{ABS}}/ten HTTP/1.0\r\n\r\n")
	add("http1.0", "get-keep-alive", "GET {{ABS}}/ten HTTP/1.0\r\nHost: {{HOST}}\r\nConnection: keep-alive\r\n\r\n")
	add("http1.0", "post-cl", "POST {{ABS}}/ten HTTP/1.0\r\nHost: {{HOST}}\r\nContent-Length: 5\r\n\r\nhello")
	add("http1.0", "post-no-length", "POST {{ABS}}/ten HTTP/1.0\r\nHost: {{HOST}}\r\n\r\nhello")
	add("http1.0", "te-and-cl", "POST {{ABS}}/ten HTTP/1.0\r\nHost: {{HOST}}\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello")
	add("http1.0", "keep-alive-pipelined", "GET {{ABS}}/ten HTTP/1.0\r\nHost: {{HOST}}\r\nConnection: keep-alive\r\n\r\nGET {{ABS}}/ten2 HTTP/1.0\r\nHost: {{HOST}}\r\nConnection: keep-alive\r\n\r\n")
	add("http1.0", "close-pipelined", "GET {{ABS}}/ten HTTP/1.0\r\nHost: {{HOST}}\r\n\r\nGET {{ABS}}/ten2 HTTP/1.1\r\nHost: {{HOST}}\r\n\r\n")

	// Expect.
	for _, c := range []struct{ name, value string }{
		{"100-continue", "100-continue"},
		{"100-Continue", "100-Continue"},
		{"list", "100-continue, x"},
		{"obfs", "x 100-continue"},
		{"other", "200-ok"},
		{"empty", ""},
		{"space-pad", " 100-continue "},
	} {
		add("expect", "post-"+c.name, body("POST", "/expect", "Expect: "+c.value+"\r\n", "hello"))
	}
	add("expect", "get", "GET {{ABS}}/expect HTTP/1.1\r\nHost: {{HOST}}\r\nExpect: 100-continue\r\n\r\n")
	add("expect", "chunked", "POST {{ABS}}/expect HTTP/1.1\r\nHost: {{HOST}}\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	add("expect", "http1.0", "POST {{ABS}}/expect HTTP/1.0\r\nHost: {{HOST}}\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello")
	add("expect", "body-is-request", body("POST", "/expect", "Expect: 100-continue\r\n", hidden))

	// Pipelining.
	add("pipelining", "get-with-body", body("GET", "/pipe", "", hidden))
	add("pipelining", "get-body-no-length", "GET {{ABS}}/pipe HTTP/1.1\r\nHost: {{HOST}}\r\n\r\nhello")
	add("pipelining", "head-then-get", "HEAD {{ABS}}/pipe HTTP/1.1\r\nHost: {{HOST}}\r\n\r\nGET {{ABS}}/pipe2 HTTP/1.1\r\nHost: {{HOST}}\r\n\r\n")
	add("pipelining", "head-with-body", body("HEAD", "/pipe", "", hidden))
	add("pipelining", "close-then-more", "GET {{ABS}}/pipe HTTP/1.1\r\nHost: {{HOST}}\r\nConnection: close\r\n\r\nGET {{ABS}}/pipe2 HTTP/1.1\r\nHost: {{HOST}}\r\n\r\n")
	add("pipelining", "ten", strings.Repeat("GET {{ABS}}/pipe HTTP/1.1\r\nHost: {{HOST}}\r\n\r\n", 10))
	add("pipelining", "chunked-then-get", "POST {{ABS}}/pipe HTTP/1.1\r\nHost: {{HOST}}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET {{ABS}}/pipe2 HTTP/1.1\r\nHost: {{HOST}}\r\n\r\n")
	add("pipelining", "cl-zero-with-request", body("POST", "/pipe", "", "")+hidden)
	add("pipelining", "options-asterisk-body", "OPTIONS * HTTP/1.1\r\nHost: {{HOST}}\r\nContent-Length: 5\r\n\r\nhello")
	add("pipelining", "delete-with-body", body("DELETE", "/pipe", "", "hello"))
	add("pipelining", "trace-with-body", body("TRACE", "/pipe", "", "hello"))
	add("pipelining", "connect-in-explicit", "CONNECT {{HOST}} HTTP/1.1\r\nHost: {{HOST}}\r\n\r\n")

	// Hop-by-hop fields naming the framing: removing them must never
	// remove the framing.
	for _, f := range []string{"Content-Length", "Transfer-Encoding", "Host", "Egret-Request-Id", "Expect", "Upgrade"} {
		add("hop-by-hop", "cl-named-"+strings.ToLower(f), body("POST", "/hop", "Connection: "+f+"\r\n", hidden))
		add("hop-by-hop", "te-named-"+strings.ToLower(f), "POST {{ABS}}/hop HTTP/1.1\r\nHost: {{HOST}}\r\nConnection: "+f+
			"\r\nTransfer-Encoding: chunked\r\n\r\n"+fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(hidden), hidden))
	}
	add("hop-by-hop", "keep-alive-cl", body("POST", "/hop", "Connection: keep-alive, Content-Length\r\nKeep-Alive: timeout=5\r\n", hidden))
	add("hop-by-hop", "proxy-connection", body("POST", "/hop", "Proxy-Connection: Content-Length\r\n", hidden))

	// Upgrade (issue 22, findings 2 to 4): an Upgrade is HTTP until the
	// upstream answers 101, and its body framed.
	upg := func(name, fields, bodyStr string) {
		add("upgrade", name, "GET {{ABS}}/upgrade HTTP/1.1\r\nHost: {{HOST}}\r\n"+fields+"\r\n"+bodyStr)
	}
	upg("websocket", "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", "")
	upg("h2c", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n", "")
	upg("foo", "Connection: Upgrade\r\nUpgrade: foo\r\n", "")
	upg("no-connection", "Upgrade: foo\r\n", "")
	upg("connection-only", "Connection: Upgrade\r\n", "")
	upg("then-cl-te", "Connection: Upgrade\r\nUpgrade: foo\r\n",
		"POST {{ABS}}/after HTTP/1.1\r\nHost: {{HOST}}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	upg("then-garbage", "Connection: Upgrade\r\nUpgrade: foo\r\n", "\x00\x01\x02 not http\r\n\r\n")
	add("upgrade", "post-cl-body-is-request", body("POST", "/upgrade", "Connection: Upgrade, Content-Length\r\nUpgrade: foo\r\n", hidden))
	add("upgrade", "post-cl-body", body("POST", "/upgrade", "Connection: Upgrade\r\nUpgrade: foo\r\n", hidden))
	add("upgrade", "post-chunked-body", "POST {{ABS}}/upgrade HTTP/1.1\r\nHost: {{HOST}}\r\nConnection: Upgrade\r\nUpgrade: foo\r\nTransfer-Encoding: chunked\r\n\r\n"+
		fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(hidden), hidden))
	add("upgrade", "http1.0", "GET {{ABS}}/upgrade HTTP/1.0\r\nHost: {{HOST}}\r\nConnection: Upgrade\r\nUpgrade: foo\r\n\r\n")
	add("upgrade", "options", "OPTIONS {{ABS}}/upgrade HTTP/1.1\r\nHost: {{HOST}}\r\nConnection: Upgrade\r\nUpgrade: foo\r\n\r\n")

	// egret's own fields, sent by the client.
	for _, f := range []string{"Egret-Request-Id: 0000000000000000", "Egret-Outcome: relayed", "Egret-Attempts: 1", "Egret-Timeout-Ms: 1000"} {
		name, _, _ := strings.Cut(f, ":")
		add("egret-fields", strings.ToLower(name), "GET {{ABS}}/egret HTTP/1.1\r\nHost: {{HOST}}\r\n"+f+"\r\n\r\n")
	}
	add("egret-fields", "request-id-twice", "GET {{ABS}}/egret HTTP/1.1\r\nHost: {{HOST}}\r\nEgret-Request-Id: a\r\nEgret-Request-Id: b\r\n\r\n")
	add("egret-fields", "timeout-bad", "GET {{ABS}}/egret HTTP/1.1\r\nHost: {{HOST}}\r\nEgret-Timeout-Ms: 1e3\r\n\r\n")
}

// Generate builds the corpus and returns it as JSON lines, sorted by id.
func Generate() ([]byte, error) {
	g := &gen{seen: map[string]string{}, ids: map[string]bool{}}
	g.smuggler()
	g.burp()
	g.garden()
	g.own()
	slices.SortStableFunc(g.cases, func(a, b Case) int { return strings.Compare(a.ID, b.ID) })
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	for i := range g.cases {
		if err := enc.Encode(&g.cases[i]); err != nil {
			return nil, fmt.Errorf("case %s: %w", g.cases[i].ID, err)
		}
	}
	return buf.Bytes(), nil
}
