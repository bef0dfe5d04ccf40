package yamlerr

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestLineOfRealErrors decodes broken documents with yaml/v3 itself and
// checks that Line names the line a person looks at: where the problem is
// for scanner errors, where the unfinished construct starts for parser
// errors (yaml/v3 names the line before it).
func TestLineOfRealErrors(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		line int
		msg  string
	}{
		// An unclosed flow list that starts on line 3.
		{"a:\n  b: 1\n  c: [1\n  d: 2\n", 3, "did not find expected ',' or ']'"},
		// A mis-indented key on line 3 (scanner).
		{"a:\n  b: 1\n   c: 2\n", 3, "mapping values are not allowed in this context"},
		// A list that starts on line 2 and a key indented off it on line 4.
		{"pods:\n  - name: a\n    cgroup: x\n   netns: host\n", 2, "did not find expected '-' indicator"},
		// A tab (scanner).
		{"a:\n\tb: 1\n", 2, "found character that cannot start any token"},
		// An unclosed flow mapping on the first line: yaml/v3 gives the
		// problem's line instead (the end, line 3), also one early.
		{"{a: 1,\n b: 2\n", 3, "did not find expected ',' or '}'"},
	} {
		var v any
		err := yaml.Unmarshal([]byte(tc.doc), &v)
		if err == nil {
			t.Fatalf("%q parsed", tc.doc)
		}
		line, msg := Line(err.Error())
		if line != tc.line || !strings.Contains(msg, tc.msg) {
			t.Errorf("%q: %v -> line %d %q, want line %d %q", tc.doc, err, line, msg, tc.line, tc.msg)
		}
	}
}

func TestLineWithoutLine(t *testing.T) {
	if line, msg := Line("yaml: control characters are not allowed"); line != 0 || msg != "control characters are not allowed" {
		t.Errorf("got %d %q", line, msg)
	}
}
