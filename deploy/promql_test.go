package deploy

import (
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// The dashboard's and the rules' PromQL is read by a small tokenizer of our
// own (the Prometheus module, whose parser would do it, is not one of
// egret's dependencies). It finds what the tests check: the metric names
// selected, the label matchers on them, and the labels of by/without/on/
// ignoring/group_left/group_right clauses. It understands strings, numbers,
// durations, comments, subqueries and Grafana's $variables, and refuses
// what it does not understand rather than guess.

type tokKind int

const (
	tokIdent tokKind = iota
	tokString
	tokNumber
	tokDuration
	tokVariable // Grafana: $name, ${name}, ${name:format}
	tokPunct
)

type token struct {
	kind tokKind
	text string // a string token's text is its value, unquoted
}

var (
	numberRE   = regexp.MustCompile(`^(0[xX][0-9a-fA-F]+|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)$`)
	durationRE = regexp.MustCompile(`^([0-9]+(ms|[smhdwy]))+$`)
)

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

func isIdentChar(c byte) bool { return isIdentStart(c) || '0' <= c && c <= '9' }

// tokenize splits a PromQL expression into tokens.
func tokenize(expr string) ([]token, error) {
	var toks []token
	brackets := 0 // inside [...], ':' separates a subquery's range and step
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == ':' && brackets > 0:
			toks = append(toks, token{tokPunct, ":"})
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			var b strings.Builder
			for ; j < len(expr) && expr[j] != c; j++ {
				if expr[j] == '\\' && c != '`' {
					j++
					if j == len(expr) {
						break
					}
				}
				b.WriteByte(expr[j])
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			toks = append(toks, token{tokString, b.String()})
			i = j + 1
		case c == '$':
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				k := strings.IndexByte(expr[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("unterminated ${ at %d", i)
				}
				j += k + 1
			} else {
				for j < len(expr) && isIdentChar(expr[j]) {
					j++
				}
			}
			if j == i+1 {
				return nil, fmt.Errorf("lone $ at %d", i)
			}
			toks = append(toks, token{tokVariable, expr[i:j]})
			i = j
		case '0' <= c && c <= '9' || c == '.' && i+1 < len(expr) && '0' <= expr[i+1] && expr[i+1] <= '9':
			j := i
			for j < len(expr) && (isIdentChar(expr[j]) && expr[j] != ':' || expr[j] == '.' ||
				(expr[j] == '+' || expr[j] == '-') && (expr[j-1] == 'e' || expr[j-1] == 'E') && !strings.HasPrefix(expr[i:j], "0x")) {
				j++
			}
			lit := expr[i:j]
			switch {
			case numberRE.MatchString(lit):
				toks = append(toks, token{tokNumber, lit})
			case durationRE.MatchString(lit):
				toks = append(toks, token{tokDuration, lit})
			default:
				return nil, fmt.Errorf("bad number or duration %q at %d", lit, i)
			}
			i = j
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdentChar(expr[j]) {
				j++
			}
			toks = append(toks, token{tokIdent, expr[i:j]})
			i = j
		default:
			two := ""
			if i+1 < len(expr) {
				two = expr[i : i+2]
			}
			switch two {
			case "==", "!=", "=~", "!~", "<=", ">=":
				toks = append(toks, token{tokPunct, two})
				i += 2
				continue
			case "[[":
				return nil, fmt.Errorf("Grafana's deprecated [[variable]] at %d: use $variable", i)
			}
			if !strings.ContainsRune("(){}[],=<>+-*/%^@:", rune(c)) {
				return nil, fmt.Errorf("unexpected %q at %d", c, i)
			}
			switch c {
			case '[':
				brackets++
			case ']':
				brackets--
			}
			toks = append(toks, token{tokPunct, string(c)})
			i++
		}
	}
	return toks, nil
}

type matcher struct{ label, op, value string }

type selector struct {
	name     string // "" for {…} alone without __name__
	matchers []matcher
}

// refs is what an expression refers to.
type refs struct {
	selectors []selector
	grouping  []string // labels of by, without, on, ignoring, group_left, group_right
}

var (
	groupingWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	// Words that are neither metrics nor calls; atan2 is a binary operator.
	keywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
		"group_left": true, "group_right": true, "inf": true, "nan": true}
)

// parseRefs finds the selectors and grouping labels of a PromQL expression.
func parseRefs(expr string) (refs, error) {
	toks, err := tokenize(expr)
	if err != nil {
		return refs{}, err
	}
	var r refs
	closing := map[string]string{")": "(", "}": "{", "]": "["}
	var stack []string
	next := func(i int) string {
		if i+1 < len(toks) && toks[i+1].kind == tokPunct {
			return toks[i+1].text
		}
		return ""
	}
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		switch t.kind {
		case tokIdent:
			word := strings.ToLower(t.text)
			switch {
			case groupingWords[word] && next(i) == "(":
				labels, end, err := labelList(toks, i+2)
				if err != nil {
					return refs{}, fmt.Errorf("%s: %w", t.text, err)
				}
				r.grouping = append(r.grouping, labels...)
				i = end
			case keywords[word]:
			case next(i) == "(":
				// A function or an aggregation; its arguments follow.
			case i+1 < len(toks) && toks[i+1].kind == tokIdent && (toks[i+1].text == "by" || toks[i+1].text == "without"):
				// An aggregation with its grouping first: sum by (l) (…).
			default:
				sel := selector{name: t.text}
				if next(i) == "{" {
					ms, end, err := matchers(toks, i+2)
					if err != nil {
						return refs{}, fmt.Errorf("%s: %w", t.text, err)
					}
					sel.matchers, i = ms, end
				}
				r.selectors = append(r.selectors, sel)
			}
		case tokPunct:
			switch t.text {
			case "{":
				ms, end, err := matchers(toks, i+1)
				if err != nil {
					return refs{}, err
				}
				sel := selector{matchers: ms}
				for _, m := range ms {
					if m.label == "__name__" && m.op == "=" {
						sel.name = m.value
					}
				}
				r.selectors = append(r.selectors, sel)
				i = end
			case "(", "[":
				stack = append(stack, t.text)
			case ")", "]":
				if len(stack) == 0 || stack[len(stack)-1] != closing[t.text] {
					return refs{}, fmt.Errorf("unbalanced %q", t.text)
				}
				stack = stack[:len(stack)-1]
			case "}":
				return refs{}, fmt.Errorf("unbalanced %q", t.text)
			}
		}
	}
	if len(stack) > 0 {
		return refs{}, fmt.Errorf("unclosed %q", stack[len(stack)-1])
	}
	return r, nil
}

// labelList reads "a, b)" from toks[i] and returns the labels and the index
// of the closing parenthesis.
func labelList(toks []token, i int) ([]string, int, error) {
	var labels []string
	for i < len(toks) {
		t := toks[i]
		if t.kind == tokPunct && t.text == ")" {
			return labels, i, nil
		}
		if t.kind != tokIdent && t.kind != tokString {
			return nil, 0, fmt.Errorf("unexpected %q in a label list", t.text)
		}
		labels = append(labels, t.text)
		i++
		if i < len(toks) && toks[i].kind == tokPunct && toks[i].text == "," {
			i++
		} else if i < len(toks) && !(toks[i].kind == tokPunct && toks[i].text == ")") {
			return nil, 0, fmt.Errorf("unexpected %q after label %q", toks[i].text, t.text)
		}
	}
	return nil, 0, fmt.Errorf("label list not closed")
}

// matchers reads `l="v", l2=~"v2"}` from toks[i] and returns the matchers
// and the index of the closing brace.
func matchers(toks []token, i int) ([]matcher, int, error) {
	var ms []matcher
	for i < len(toks) {
		t := toks[i]
		if t.kind == tokPunct && t.text == "}" {
			return ms, i, nil
		}
		if t.kind != tokIdent || i+2 >= len(toks) {
			return nil, 0, fmt.Errorf("unexpected %q in a selector", t.text)
		}
		op, val := toks[i+1], toks[i+2]
		if op.kind != tokPunct || (op.text != "=" && op.text != "!=" && op.text != "=~" && op.text != "!~") || val.kind != tokString {
			return nil, 0, fmt.Errorf("bad matcher after %q", t.text)
		}
		ms = append(ms, matcher{t.text, op.text, val.text})
		i += 3
		if i < len(toks) && toks[i].kind == tokPunct && toks[i].text == "," {
			i++
		} else if i < len(toks) && !(toks[i].kind == tokPunct && toks[i].text == "}") {
			return nil, 0, fmt.Errorf("unexpected %q after matcher %s", toks[i].text, t.text)
		}
	}
	return nil, 0, fmt.Errorf("selector not closed")
}

func TestTokenize(t *testing.T) {
	toks, err := tokenize(`rate(a_b:c{x="q\"}"}[5m]) offset 1h30m > bool 1.5e-3 # note
	+ 0x1F - .5 * $__rate_interval / ${node:csv}`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tk := range toks {
		got = append(got, fmt.Sprintf("%d:%s", tk.kind, tk.text))
	}
	want := []string{"0:rate", "5:(", "0:a_b:c", "5:{", "0:x", "5:=", `1:q"}`, "5:}", "5:[", "3:5m", "5:]", "5:)",
		"0:offset", "3:1h30m", "5:>", "0:bool", "2:1.5e-3", "5:+", "2:0x1F", "5:-", "2:.5", "5:*",
		"4:$__rate_interval", "5:/", "4:${node:csv}"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tokens\n %q\nwant\n %q", got, want)
	}
	for _, bad := range []string{`a{x="unterminated}`, `a[5q]`, `a ~ b`, `$`, `[[node]]`, "a{x=`raw}"} {
		if _, err := tokenize(bad); err == nil {
			t.Errorf("%q tokenized", bad)
		}
	}
}

func TestParseRefs(t *testing.T) {
	for _, tc := range []struct {
		expr     string
		names    []string
		matchers []string // label op value, over all selectors
		grouping []string
	}{
		{expr: `up`, names: []string{"up"}},
		{expr: `sum by (node, outcome) (rate(egret_proxy_requests_total{node=~"$node", outcome!="relayed"}[$__rate_interval]))`,
			names: []string{"egret_proxy_requests_total"}, matchers: []string{`node=~$node`, `outcome!=relayed`}, grouping: []string{"node", "outcome"}},
		{expr: `sum(rate(a[5m])) without (instance) / on(node) group_left(pod) max(b) > bool 0 and c unless d or e`,
			names: []string{"a", "b", "c", "d", "e"}, grouping: []string{"instance", "node", "pod"}},
		{expr: `histogram_quantile(0.99, sum by (le) (rate(x_bucket{job="egret",}[5m:1m])))`,
			names: []string{"x_bucket"}, matchers: []string{"job=egret"}, grouping: []string{"le"}},
		{expr: `{__name__="egret_agent_pods", state="failed"} offset 5m`,
			names: []string{"egret_agent_pods"}, matchers: []string{"__name__=egret_agent_pods", "state=failed"}},
		{expr: `count(up == 0) or vector(0) + atan2 time() + Inf - NaN`, names: []string{"up"}},
		{expr: `label_replace(m, "dst", "$1", "src", "(.*)") # by (ignored) comment`, names: []string{"m"}},
		{expr: `topk(3, sum by ("quoted") (m @ start()))`, names: []string{"m"}, grouping: []string{"quoted"}},
	} {
		r, err := parseRefs(tc.expr)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		var names, ms []string
		for _, s := range r.selectors {
			names = append(names, s.name)
			for _, m := range s.matchers {
				ms = append(ms, m.label+m.op+m.value)
			}
		}
		if !reflect.DeepEqual(names, tc.names) || !reflect.DeepEqual(ms, tc.matchers) || !reflect.DeepEqual(r.grouping, tc.grouping) {
			t.Errorf("%s:\n names %q matchers %q grouping %q\n want %q %q %q", tc.expr, names, ms, r.grouping, tc.names, tc.matchers, tc.grouping)
		}
	}
	for _, bad := range []string{`sum(rate(a[5m])`, `a{x="1"`, `a{x}`, `a{x=1}`, `sum by (a b) (c)`, `a{x="1" y="2"}`, `a)`, `a}`, `(a]`} {
		if r, err := parseRefs(bad); err == nil {
			t.Errorf("%q parsed: %+v", bad, r)
		}
	}
}
