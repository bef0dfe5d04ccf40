// Command leftovers shows the kernel state a test run left on the host.
//
//	leftovers snapshot FILE        # before the tests: the host's state, into FILE
//	leftovers check [-wait D] [-ignore RE]... FILE # after: what is there now and not in FILE
//
// check exits 1 and prints each new object (netns, link, cgroup, pin,
// mount, nft table, iptables rule) when something remains after -wait
// (default 10s: the kernel removes some things a moment after their owner
// went, a netns's interfaces after its last reference, say); 2 on a usage
// error. -ignore leaves out objects that match a regular expression (a
// host whose own services make cgroups meanwhile, say). .ci/run takes a
// snapshot before go test and checks after it.
package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/egret-proxy/egret/test/leftovers"
)

func main() {
	fs := flag.NewFlagSet("leftovers", flag.ContinueOnError)
	wait := fs.Duration("wait", 10*time.Second, "how long the state may take to go after the tests (check)")
	var ignore []*regexp.Regexp
	fs.Func("ignore", "a regular expression of objects that are not the tests' (check; repeatable): what the host's own services make meanwhile", func(v string) error {
		re, err := regexp.Compile(v)
		if err == nil {
			ignore = append(ignore, re)
		}
		return err
	})
	usage := func(msg string) {
		fmt.Fprintf(os.Stderr, "leftovers: %s\nusage: leftovers snapshot FILE | leftovers check [-wait D] [-ignore RE]... FILE\n", msg)
		os.Exit(2)
	}
	if len(os.Args) < 2 {
		usage("a command is needed")
	}
	if err := fs.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() != 1 {
		usage("one FILE is needed")
	}
	file := fs.Arg(0)
	switch os.Args[1] {
	case "snapshot":
		s := leftovers.Take()
		for _, e := range s.Errors {
			fmt.Fprintf(os.Stderr, "leftovers: not read: %s\n", e)
		}
		if err := s.Write(file); err != nil {
			fmt.Fprintln(os.Stderr, "leftovers:", err)
			os.Exit(1)
		}
		fmt.Printf("leftovers: %d objects in %s\n", len(s.Items), file)
	case "check":
		before, err := leftovers.Read(file)
		if err != nil {
			fmt.Fprintln(os.Stderr, "leftovers:", err)
			os.Exit(1)
		}
		left, after := leftovers.Wait(before, *wait, ignore...)
		for _, e := range after.Errors {
			fmt.Fprintf(os.Stderr, "leftovers: not read: %s\n", e)
		}
		if len(left) == 0 {
			fmt.Printf("leftovers: none (%d objects before, %d after)\n", len(before.Items), len(after.Items))
			return
		}
		fmt.Printf("leftovers: %d objects the tests left behind:\n", len(left))
		for _, it := range left {
			fmt.Println("  " + it)
		}
		os.Exit(1)
	default:
		usage(fmt.Sprintf("unknown command %q", os.Args[1]))
	}
}
