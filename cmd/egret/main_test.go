package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// egretBin builds the real binary once per test run.
func egretBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "egret")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func run(t *testing.T, bin string, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

type want struct {
	Decision   string `json:"decision"`
	Reason     string `json:"reason"`
	DelayMinMS *int64 `json:"delay_min_ms"`
	DelayMaxMS *int64 `json:"delay_max_ms"`
}

type answer struct {
	Decision string `json:"decision"`
	Reason   string `json:"reason"`
	DelayMS  *int64 `json:"delay_ms"`
	Error    string `json:"error"`
}

// TestSimulatePublicVectors feeds every public vector through the real
// `egret simulate` binary, as a file and on stdin, and checks each answer.
// The vectors are the engine's testdata (the spec's, committed; see
// engine/testdata/README.md), or the file EGRET_VECTORS names.
func TestSimulatePublicVectors(t *testing.T) {
	path := filepath.Join("..", "..", "engine", "testdata", "public-vectors.jsonl")
	if v := os.Getenv("EGRET_VECTORS"); v != "" {
		path = v
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("public vectors: %v", err)
	}
	var inputs bytes.Buffer
	var wants []want
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		var v struct {
			Input json.RawMessage `json:"input"`
			Want  want            `json:"want"`
		}
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		inputs.Write(v.Input)
		inputs.WriteByte('\n')
		wants = append(wants, v.Want)
	}
	bin := egretBin(t)
	file := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(file, inputs.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"simulate"}, {"simulate", file}} {
		stdin := inputs.String()
		if len(args) == 2 {
			stdin = ""
		}
		out, errOut, code := run(t, bin, stdin, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d, stderr %q", args, code, errOut)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(lines) != len(wants) {
			t.Fatalf("%v: %d answers for %d vectors", args, len(lines), len(wants))
		}
		for i, l := range lines {
			var a answer
			dec := json.NewDecoder(strings.NewReader(l))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&a); err != nil {
				t.Fatalf("answer %d %q: %v", i+1, l, err)
			}
			w := wants[i]
			if a.Decision != w.Decision || a.Reason != w.Reason || a.Error != "" {
				t.Errorf("vector %d: got %q, want %s/%s", i+1, l, w.Decision, w.Reason)
				continue
			}
			if (a.DelayMS != nil) != (w.Decision == "retry") {
				t.Errorf("vector %d: delay_ms presence wrong in %q", i+1, l)
				continue
			}
			if a.DelayMS != nil && (*a.DelayMS < *w.DelayMinMS || *a.DelayMS > *w.DelayMaxMS) {
				t.Errorf("vector %d: delay %d outside [%d, %d]", i+1, *a.DelayMS, *w.DelayMinMS, *w.DelayMaxMS)
			}
		}
	}
}

// TestSimulateBadLines: a bad line gets an error line naming the problem,
// the following lines are still answered, and the exit status is 1.
func TestSimulateBadLines(t *testing.T) {
	bin := egretBin(t)
	in := strings.Join([]string{
		`{"attempt":1,"failure":"write_failed"}`,
		`{"attempt":0,"failure":"write_failed"}`,
		`not json`,
		`{"attempt":1,"failure":"teleport_failed"}`,
		`{"attempt":1,"status":503,"idempotent":true,"colour":"red"}`,
		`{"attempt":1}`,
		`{"attempt":1,"body":"sometimes"}`,
		`{"attempt":1.5,"failure":"write_failed"}`,
		`{"attempt":1,"status":503}`,
	}, "\n")
	out, _, code := run(t, bin, in, "simulate")
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 9 {
		t.Fatalf("got %d lines: %q", len(lines), out)
	}
	if lines[0] != `{"decision":"ambiguous","reason":"no_response"}` {
		t.Errorf("line 1: %s", lines[0])
	}
	if lines[8] != `{"decision":"ambiguous","reason":"status"}` {
		t.Errorf("line 9: %s", lines[8])
	}
	mentions := map[int]string{1: "attempt", 2: "invalid character", 3: "teleport_failed", 4: "colour", 5: "required", 6: "sometimes", 7: "attempt"}
	for i, word := range mentions {
		var a answer
		if err := json.Unmarshal([]byte(lines[i]), &a); err != nil || a.Error == "" || !strings.Contains(a.Error, word) {
			t.Errorf("line %d: %q should be an error mentioning %q", i+1, lines[i], word)
		}
	}
}

// TestSimulateDoneWhen is the acceptance line, verbatim.
func TestSimulateDoneWhen(t *testing.T) {
	out, errOut, code := run(t, egretBin(t), `{"attempt":1,"failure":"write_failed"}`+"\n", "simulate")
	if code != 0 || out != `{"decision":"ambiguous","reason":"no_response"}`+"\n" {
		t.Fatalf("exit %d, out %q, stderr %q", code, out, errOut)
	}
}
