// Package yamlerr reads the line out of a go.yaml.in/yaml/v3 error, and
// puts right the line that the library reports one too early.
//
// yaml/v3 formats a parser error (as opposed to a scanner error) with the
// 0-based line of the construct it was parsing, so "did not find expected
// key" in a mapping that starts on line 3 comes out as "line 2" (for a
// construct on the first line, the line of the problem, also one early).
// Line returns 1-based lines for both kinds.
package yamlerr

import (
	"regexp"
	"strconv"
	"strings"
)

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// parserProblems are the messages of yaml/v3's parser errors (parserc.go);
// every other syntax message is the scanner's, whose line is right.
var parserProblems = map[string]bool{
	"did not find expected <stream-start>":   true,
	"did not find expected <document start>": true,
	"found undefined tag handle":             true,
	"did not find expected node content":     true,
	"did not find expected '-' indicator":    true,
	"did not find expected key":              true,
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found duplicate %TAG directive":         true,
}

// Line splits one yaml/v3 error message ("yaml: line 3: ...", or one line
// of a TypeError) into its 1-based line (0 when it names none) and the
// message without the prefix.
func Line(msg string) (line int, rest string) {
	m := yamlLine.FindStringSubmatch(msg)
	if m == nil {
		rest = strings.TrimPrefix(msg, "yaml: ")
		if parserProblems[rest] {
			// Both marks on the first line: yaml/v3 names no line.
			return 1, rest
		}
		return 0, rest
	}
	line, _ = strconv.Atoi(m[1])
	if parserProblems[m[2]] {
		line++
	}
	return line, m[2]
}
