// Command gen writes the smuggling suite's corpus,
// test/smuggle/testdata/cases.jsonl, from smuggle.Generate (its comment
// names the public sources). Run from the repository's root:
//
//	go run ./test/smuggle/cmd/gen
package main

import (
	"flag"
	"fmt"
	"log"
	"os"

	"github.com/egret-proxy/egret/test/smuggle"
)

func main() {
	out := flag.String("o", "test/smuggle/testdata/cases.jsonl", "where to write the corpus")
	flag.Parse()
	b, err := smuggle.Generate()
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		log.Fatal(err)
	}
	cases, err := smuggle.LoadCases(*out)
	if err != nil {
		log.Fatal(err)
	}
	classes := map[string]int{}
	for _, c := range cases {
		classes[c.Class]++
	}
	fmt.Printf("%d cases in %s: %v\n", len(cases), *out, classes)
}
