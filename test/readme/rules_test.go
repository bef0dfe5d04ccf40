package readme

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// repoRoot is the repository's top directory, seen from this package.
const repoRoot = "../.."

// fence is one fenced block of a README.
type fence struct {
	line    int    // of its opening ``` (1-based)
	info    string // the language after the ```, "" for none
	body    []string
	section string // the heading above it
	notRun  string // the reason of a "<!-- not run: WHY -->" just before it
	marked  bool   // that line is there (its reason may be empty)
}

// session reports whether f is a terminal session: no language, and a
// first line that starts with "$ ".
func (f fence) session() bool {
	return f.info == "" && len(f.body) > 0 && strings.HasPrefix(f.body[0], "$ ")
}

// shell reports whether f shows commands to type: a session, or a block
// tagged as a shell's.
func (f fence) shell() bool {
	switch f.info {
	case "sh", "bash", "shell", "console", "zsh":
		return true
	}
	return f.session()
}

var notRunRE = regexp.MustCompile(`^<!--\s*not run:(.*?)-->\s*$`)

// parseFences returns the fenced blocks of a README's text.
func parseFences(text string) []fence {
	lines := strings.Split(text, "\n")
	var fences []fence
	section := ""
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(l, "#") {
			section = strings.TrimSpace(strings.TrimLeft(l, "#"))
			continue
		}
		if !strings.HasPrefix(strings.TrimLeft(l, " "), "```") {
			continue
		}
		indent := len(l) - len(strings.TrimLeft(l, " "))
		f := fence{line: i + 1, info: strings.TrimSpace(strings.TrimLeft(l, " `")), section: section}
		for k := i - 1; k >= 0; k-- {
			if strings.TrimSpace(lines[k]) == "" {
				continue
			}
			if m := notRunRE.FindStringSubmatch(strings.TrimSpace(lines[k])); m != nil {
				f.marked, f.notRun = true, strings.TrimSpace(m[1])
			}
			break
		}
		j := i + 1
		for j < len(lines) && !strings.HasPrefix(strings.TrimLeft(lines[j], " "), "```") {
			b := lines[j]
			if len(b)-len(strings.TrimLeft(b, " ")) >= indent {
				b = b[indent:]
			}
			f.body = append(f.body, b)
			j++
		}
		fences = append(fences, f)
		i = j
	}
	return fences
}

// readmes returns the paths, relative to the repository's top, of every
// README.md in it (outside hidden directories and testdata).
func readmes(t *testing.T) []string {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != repoRoot && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == "README.md" {
			rel, err := filepath.Rel(repoRoot, p)
			if err != nil {
				return err
			}
			paths = append(paths, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatalf("no README.md under %s", repoRoot)
	}
	return paths
}

// TestREADMERules holds every README to the rule that makes its examples
// trustworthy: a command a person would type is either in a session
// TestREADMEExamples runs and checks, or carries, just before its block,
// "<!-- not run: WHY -->" with the reason. A block with no language must be
// a session (output, listings and diagrams say ```text), so that no command
// hides in an untagged block.
func TestREADMERules(t *testing.T) {
	paths := readmes(t)
	run := 0
	for _, p := range paths {
		text, err := os.ReadFile(filepath.Join(repoRoot, p))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(text), "\n")
		fences := parseFences(string(text))
		opening := map[int]bool{}
		for _, f := range fences {
			opening[f.line] = true
			where := p + ":" + strconv.Itoa(f.line)
			switch {
			case f.info == "" && !f.session():
				t.Errorf("%s: a block without a language must be a terminal session (\"$ \" lines, run by TestREADMEExamples); say what it is instead (```text for output, listings and diagrams, ```sh for commands)", where)
			case f.info != "" && len(f.body) > 0 && strings.HasPrefix(f.body[0], "$ "):
				t.Errorf("%s: a ```%s block written as a terminal session: drop the language so that TestREADMEExamples runs it, or put <!-- not run: WHY --> before it", where, f.info)
			}
			if f.shell() && !f.marked {
				if f.session() {
					run++
				} else {
					t.Errorf("%s: a ```%s example TestREADMEExamples does not run: make it a \"$ \" session whose output the README shows, or put <!-- not run: WHY --> just before it", where, f.info)
				}
			}
			if f.marked && f.notRun == "" {
				t.Errorf("%s: <!-- not run: --> without a reason", where)
			}
			if f.marked && !f.shell() {
				t.Errorf("%s: <!-- not run --> before a ```%s block, which is not a shell example", where, f.info)
			}
		}
		// A marker must stand just before a block, or it marks nothing.
		for i, l := range lines {
			if !notRunRE.MatchString(strings.TrimSpace(l)) {
				continue
			}
			k := i + 1
			for k < len(lines) && strings.TrimSpace(lines[k]) == "" {
				k++
			}
			if !opening[k+1] {
				t.Errorf("%s:%d: <!-- not run --> not followed by a fenced block", p, i+1)
			}
		}
	}
	if run == 0 {
		t.Error("no README has a session TestREADMEExamples runs")
	}
	t.Logf("%d READMEs, %d sessions run by TestREADMEExamples", len(paths), run)

	// The test command the top README gives is the one CI runs.
	top, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile(filepath.Join(repoRoot, ".ci/run"))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range parseFences(string(top)) {
		for _, l := range f.body {
			if !strings.HasPrefix(l, "go run ./test/gotest ") {
				continue
			}
			found = true
			cmd := strings.TrimSpace(strings.SplitN(l, "#", 2)[0])
			if !hasLine(string(ci), cmd) {
				t.Errorf("README.md gives the test command %q, which .ci/run does not run", cmd)
			}
		}
	}
	if !found {
		t.Error("README.md gives no test command (go run ./test/gotest ...)")
	}
}

func hasLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// TestGitignoreKeepsBuildOutputOut: what the README's commands leave in the
// top directory (go build ./cmd/egret's 59 MB binary, the image tarball,
// the examples' files) is ignored by git, and the sources are not.
func TestGitignoreKeepsBuildOutputOut(t *testing.T) {
	if err := exec.Command("git", "-C", repoRoot, "rev-parse", "--is-inside-work-tree").Run(); err != nil {
		t.Skipf("not a git work tree: %v", err)
	}
	for _, p := range []string{"egret", "kubectl-egret", "egret.tar", "pods.yaml", "policy.yaml", "ask.sock"} {
		if err := exec.Command("git", "-C", repoRoot, "check-ignore", "-q", "--no-index", p).Run(); err != nil {
			t.Errorf("git does not ignore %s in the top directory (.gitignore): %v", p, err)
		}
	}
	for _, p := range []string{"cmd/egret/main.go", "cmd/kubectl-egret", "deploy/image/main.go", "README.md"} {
		if exec.Command("git", "-C", repoRoot, "check-ignore", "-q", "--no-index", p).Run() == nil {
			t.Errorf("git ignores %s, a source", p)
		}
	}
}
