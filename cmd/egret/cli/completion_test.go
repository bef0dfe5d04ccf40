package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// The completion scripts load in real bash, zsh and fish and complete
// egret's commands and flags by asking the built egret: "egret obs" gives
// observe, "egret observe --fo" gives --follow, "egret agent " the agent's
// subcommands.
func TestCompletionInRealShells(t *testing.T) {
	bin := buildEgret(t)
	env := append(os.Environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	shell := func(name string, args ...string) []string {
		t.Helper()
		path, err := exec.LookPath(name)
		if err != nil {
			testenv.Require(t, false, name+" is installed (apt-get install "+name+")")
		}
		cmd := exec.Command(path, args...)
		cmd.Env = env
		cmd.Dir = t.TempDir()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %q: %v\n%s", name, args, err, out)
		}
		return strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	// Each case: the words typed, the last being completed; a candidate
	// that must come, and one that must not.
	cases := []struct {
		words     []string
		want, not string
	}{
		{[]string{"egret", "obs"}, "observe", "policy"},
		{[]string{"egret", "observe", "--fo"}, "--follow", "--pod"},
		{[]string{"egret", "agent", ""}, "explain", "simulate"},
		{[]string{"egret", "completion", ""}, "zsh", "observe"},
	}
	check := func(sh string, words []string, got []string, want, not string) {
		t.Helper()
		if !slices.Contains(got, want) || slices.Contains(got, not) {
			t.Errorf("%s: %q completes to %q; want %q among them, not %q", sh, strings.Join(words, " "), got, want, not)
		}
	}

	// bash: the script registers _egret_complete for egret; called as
	// bash calls it, with COMP_WORDS and COMP_CWORD.
	if got := shell("bash", "-c", `source <(egret completion bash) && complete -p egret`); !strings.Contains(got[0], "-F _egret_complete") {
		t.Errorf("bash: complete -p egret: %q", got)
	}
	for _, c := range cases {
		script := `source <(egret completion bash)
COMP_WORDS=(` + quoteWords(c.words) + `); COMP_CWORD=` + strconv.Itoa(len(c.words)-1) + `
_egret_complete; printf '%s\n' "${COMPREPLY[@]}"`
		check("bash", c.words, shell("bash", "-c", script), c.want, c.not)
	}

	// zsh: loaded after compinit it registers _egret (compdef); the
	// function is run with words and CURRENT as the completion system
	// sets them, compadd printing what it is given that matches the word
	// being completed (as the real one matches it).
	if got := shell("zsh", "-fc", `autoload -U compinit && compinit -u -D && source <(egret completion zsh) && print -r -- $_comps[egret]`); got[0] != "_egret" {
		t.Errorf("zsh: _comps[egret] = %q", got)
	}
	for _, c := range cases {
		script := `source <(egret completion zsh)
compadd() { [[ $1 == -- ]] && shift; print -rl -- ${(M)@:#${words[CURRENT]}*} }
_files() { print -r -- _files }
words=(` + quoteWords(c.words) + `); CURRENT=` + strconv.Itoa(len(c.words)) + `
_egret`
		check("zsh", c.words, shell("zsh", "-fc", script), c.want, c.not)
	}

	// fish: its own completion engine, complete -C.
	for _, c := range cases {
		got := shell("fish", "--no-config", "-c", `egret completion fish | source; complete -C `+quote(strings.Join(c.words, " ")))
		for i, g := range got {
			got[i], _, _ = strings.Cut(g, "\t")
		}
		check("fish", c.words, got, c.want, c.not)
	}

	// A shell that is none of these is a usage error.
	if _, errOut, code := egret("completion", "tcsh"); code != ExitUsage || !strings.Contains(errOut, "expected bash, zsh or fish") {
		t.Errorf("completion tcsh: status %d, %q", code, errOut)
	}
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func quoteWords(ws []string) string {
	q := make([]string, len(ws))
	for i, w := range ws {
		q[i] = quote(w)
	}
	return strings.Join(q, " ")
}
