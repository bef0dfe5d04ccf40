package engine_test

import (
	"bufio"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/egret-proxy/egret/engine/simulate"
)

// Vector is one line of public-vectors.jsonl.
type Vector struct {
	Line  int
	Input json.RawMessage `json:"input"`
	Want  struct {
		Decision   string `json:"decision"`
		Reason     string `json:"reason"`
		DelayMinMS *int64 `json:"delay_min_ms"`
		DelayMaxMS *int64 `json:"delay_max_ms"`
	} `json:"want"`
}

// vectorsPath is the spec's public vectors, committed in testdata (a copy
// of the spec's public-vectors.jsonl; testdata/README.md says where from),
// or the file EGRET_VECTORS names (a larger conformance set, same format).
func vectorsPath(t testing.TB) string {
	if v := os.Getenv("EGRET_VECTORS"); v != "" {
		return v
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "testdata", "public-vectors.jsonl")
}

func loadVectors(t testing.TB) []Vector {
	t.Helper()
	f, err := os.Open(vectorsPath(t))
	if err != nil {
		t.Fatalf("public vectors: %v (set EGRET_VECTORS to their path)", err)
	}
	defer f.Close()
	var vs []Vector
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var v Vector
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("vector line %d: %v", n, err)
		}
		v.Line = n
		vs = append(vs, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(vs) == 0 {
		t.Fatal("no vectors")
	}
	return vs
}

// CheckAnswer compares one simulate answer with a vector's want.
func (v Vector) CheckAnswer(t testing.TB, a simulate.Answer) {
	t.Helper()
	if a.Error != "" {
		t.Errorf("line %d %s: error %q", v.Line, v.Input, a.Error)
		return
	}
	if a.Decision != v.Want.Decision || a.Reason != v.Want.Reason {
		t.Errorf("line %d %s: got %s/%s, want %s/%s", v.Line, v.Input, a.Decision, a.Reason, v.Want.Decision, v.Want.Reason)
	}
	if a.Decision != "retry" {
		if a.DelayMS != nil {
			t.Errorf("line %d: delay_ms %d given without retry", v.Line, *a.DelayMS)
		}
		return
	}
	if a.DelayMS == nil {
		t.Errorf("line %d: retry without delay_ms", v.Line)
		return
	}
	if v.Want.DelayMinMS != nil && *a.DelayMS < *v.Want.DelayMinMS || v.Want.DelayMaxMS != nil && *a.DelayMS > *v.Want.DelayMaxMS {
		t.Errorf("line %d %s: delay %d outside [%v, %v]", v.Line, v.Input, *a.DelayMS, *v.Want.DelayMinMS, *v.Want.DelayMaxMS)
	}
}

// TestPublicVectorsGoAPI runs every public vector through the engine's Go
// API, many times each with different random draws so that every delay
// bound is exercised, including both ends of the jitter.
func TestPublicVectorsGoAPI(t *testing.T) {
	vs := loadVectors(t)
	rnds := []interface{ Int64N(int64) int64 }{lowRand{}, highRand{}}
	for seed := uint64(1); seed <= 200; seed++ {
		rnds = append(rnds, rand.New(rand.NewPCG(seed, seed*7)))
	}
	for _, v := range vs {
		in, err := simulate.Parse(v.Input)
		if err != nil {
			t.Errorf("line %d: %v", v.Line, err)
			continue
		}
		for _, r := range rnds {
			v.CheckAnswer(t, simulate.Decide(&in, r))
		}
	}
}

// lowRand and highRand draw the ends of every range.
type lowRand struct{}

func (lowRand) Int64N(int64) int64 { return 0 }

type highRand struct{}

func (highRand) Int64N(n int64) int64 { return n - 1 }
