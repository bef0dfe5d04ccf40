// The test runs the command examples of every README.md of the repository
// against a built egret and a real ledger, and checks their output against
// what the README shows: a README that drifts from the code fails the test.
// TestREADMERules (rules_test.go) makes sure no shell example escapes it:
// each is a session run here or says why not.
//
// Each fenced block without a language whose first line starts with "$ " is
// a terminal session, run unless a "<!-- not run: WHY -->" line stands
// just before it: "$ CMD" lines are commands (run by sh with egret on PATH;
// a here-document continues to its terminator), the lines up to the next
// "$ " are what the terminal shows.
//
// A README's sessions run in one shell, in order, as a person pasting them
// into one terminal would: one working directory for the whole README (a
// file one example writes, the next finds), and one table of background
// jobs, numbered as bash numbers them (one more than the highest running;
// 1 when none runs). A command ending in "&" is a background job whose
// output (stdout and stderr) comes in as it is written; "kill %N" sends the
// running job N a SIGTERM, and the job's last lines are what the README
// shows after it; the test then waits for the job to exit. A job an
// example leaves running is still running in the next one (a second egret
// proxy on the same port fails to bind, "kill %1" reaches the first job),
// and one still running at the end of the README fails the test, as do
// lines a stopped job wrote that the README does not show. The shell's own
// job notices ("[1] 4242", "[1]+ Terminated") are not shown. A foreground
// command's output is its stderr, then its stdout. "..." stands for any lines (the rest of a command's output, and
// the job lines that come before the next expected line), and the values
// that vary from run to run are written as <id>, <hex>, <n>, <port>, <ip>,
// <duration> and <time> (the top README's legend); an <id> in a command is the
// request id last matched.
//
// The READMEs' fixed names are replaced with unique ones so that runs beside
// other tests do not collide: 18080 becomes the port of a ledger this test
// starts on 127.0.0.1, 18090 that of the same ledger on every address (for
// a command in a namespace of its own), 127.0.0.1:15001, 15002 and 18999 free ports (an "egret proxy" without --listen is
// given the one that replaces 15001), egret-demo and demo-web get a random
// suffix. Blocks that run "egret run" or "egret agent" need root (they fail
// without it under CI=true) and remove the cgroup, pins and socket they name
// even when they fail.

package readme

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/test/ledger"
)

// lineWait bounds how long an expected line of a background job may take to
// come; it is a failure deadline, not synchronisation.
const lineWait = 30 * time.Second

// block is one terminal session of the README.
type block struct {
	line    int    // of its first "$ " line in README.md
	section string // the heading above it
	steps   []step
}

type step struct {
	line int
	cmd  string
	want []string
}

var (
	heredoc  = regexp.MustCompile(`<<\s*'?([A-Za-z_]+)'?\s*$`)
	bgSuffix = regexp.MustCompile(`\s*&\s*(#.*)?$`)
	killJob  = regexp.MustCompile(`^kill %([0-9]+)\b`)
	holes    = map[string]string{
		"<id>":       `([0-9a-f]{16})`,
		"<hex>":      `[0-9a-f]+`,
		"<n>":        `[0-9]+`,
		"<port>":     `[0-9]{1,5}`,
		"<ip>":       `[0-9a-f.:]+`,
		"<duration>": `(?:[0-9]+(?:\.[0-9]+)?(?: ?(?:ns|µs|us|ms|s|m|h)))+`,
		"<time>":     `[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+(?:Z|[+-][0-9:]+)`,
	}
	holeRE = regexp.MustCompile(`<(id|hex|n|port|ip|duration|time)>`)
)

// parseREADME returns the README's terminal sessions that are run (those
// without a "<!-- not run -->" line before them).
func parseREADME(text string) []block {
	var blocks []block
	for _, f := range parseFences(text) {
		if !f.session() || f.marked {
			continue
		}
		first := f.line + 1
		b := block{line: first, section: f.section}
		body := f.body
		for k := 0; k < len(body); k++ {
			l := body[k]
			if !strings.HasPrefix(l, "$ ") {
				last := &b.steps[len(b.steps)-1]
				last.want = append(last.want, l)
				continue
			}
			s := step{line: first + k, cmd: strings.TrimPrefix(l, "$ ")}
			if m := heredoc.FindStringSubmatch(s.cmd); m != nil {
				for k+1 < len(body) {
					k++
					s.cmd += "\n" + body[k]
					if body[k] == m[1] {
						break
					}
				}
			}
			b.steps = append(b.steps, s)
		}
		blocks = append(blocks, b)
	}
	return blocks
}

func TestREADMEExamples(t *testing.T) {
	type readme struct {
		path   string
		blocks []block
	}
	var all []readme
	for _, p := range readmes(t) {
		text, err := os.ReadFile(filepath.Join(repoRoot, p))
		if err != nil {
			t.Fatal(err)
		}
		if bs := parseREADME(string(text)); len(bs) > 0 {
			all = append(all, readme{p, bs})
		}
	}
	// The examples the READMEs must keep; a removed one fails here.
	keep := map[string][]string{
		"README.md":              {"egret proxy", "curl -si -x", "egret run --", "egret agent --pods", "egret explain", "egret observe", "egret policy", "egret simulate", "egret proxy --grace 5", "egret prxy"},
		"agent/README.md":        {"egret run --", "egret run --netns new", "egret agent --pods", "egret pods"},
		"proxy/policy/README.md": {"egret proxy --policy"},
	}
	for file, cmds := range keep {
		cmdsRun := ""
		for _, r := range all {
			if r.path != file {
				continue
			}
			for _, b := range r.blocks {
				for _, s := range b.steps {
					cmdsRun += s.cmd + "\n"
				}
			}
		}
		for _, c := range cmds {
			if !strings.Contains(cmdsRun, c) {
				t.Errorf("%s has no example running %q", file, c)
			}
		}
	}

	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin, "github.com/egret-proxy/egret/cmd/egret")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build egret: %v\n%s", err, out)
	}

	l := ledger.New()
	laddr, err := l.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	_, ledgerPort, _ := net.SplitHostPort(laddr.String())
	// The same ledger on every address, for a command in a namespace of its
	// own (it reaches the host at the veth's host end).
	aaddr, err := l.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	_, anyPort, _ := net.SplitHostPort(aaddr.String())
	proxyPort, podPort, deadPort := freePort(t), freePort(t), freePort(t)
	suffix := randHex(t)
	cgroupRoot := "/sys/fs/cgroup/unified"
	if !isCgroup2(cgroupRoot) {
		cgroupRoot = "/sys/fs/cgroup"
	}
	subst := strings.NewReplacer(
		"18080", ledgerPort,
		"18090", anyPort,
		"127.0.0.1:15001", "127.0.0.1:"+proxyPort,
		"15002", podPort,
		"18999", deadPort,
		"egret-demo", "egret-demo-"+suffix,
		"demo-web", "demo-web-"+suffix,
		"/sys/fs/cgroup/unified", cgroupRoot,
	)
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))

	for _, r := range all {
		t.Run(r.path, func(t *testing.T) {
			runREADME(t, r.path, r.blocks, cgroupRoot, suffix, &session{env: env, subst: subst, proxyPort: proxyPort})
		})
	}
}

// runREADME runs the sessions of one README in one shell, in order, each
// in a subtest named after where it is. Once one fails, the later ones,
// which may depend on what it left, are not run.
func runREADME(t *testing.T, path string, blocks []block, cgroupRoot, suffix string, tmpl *session) {
	s := &session{t: t, file: path, dir: t.TempDir(), env: tmpl.env, subst: tmpl.subst, proxyPort: tmpl.proxyPort, lines: make(chan jobLine, 1024)}
	t.Cleanup(func() {
		s.stopJobs()
		os.Remove("/run/egret-demo-" + suffix + ".sock")
		os.RemoveAll("/sys/fs/bpf/egret-demo-" + suffix)
		os.Remove(filepath.Join(cgroupRoot, "demo-web-"+suffix))
		// The agent's own cgroup, left when it was killed.
		agents, _ := filepath.Glob(filepath.Join(cgroupRoot, "egret-agent-egret-demo-"+suffix+"-*"))
		for _, a := range agents {
			if err := os.Remove(a); err != nil {
				t.Errorf("the agent's cgroup: %v", err)
			}
		}
	})
	failed := ""
	for _, b := range blocks {
		t.Run(strconv.Itoa(b.line), func(t *testing.T) {
			t.Logf("%s:%d (%s)", path, b.line, b.section)
			if failed != "" {
				t.Skipf("not run: the example at %s, before it in the same shell, failed", failed)
			}
			if needsRoot(b) {
				testenv.RequireRoot(t)
			}
			s.t = t
			for _, st := range b.steps {
				if !s.run(st) {
					failed = fmt.Sprintf("%s:%d", path, b.line)
					return
				}
			}
		})
	}
	s.t = t
	if failed != "" {
		return
	}
	s.reap()
	for _, j := range s.jobs {
		t.Errorf("%s leaves job %%%d running at its end (%s): a person pasting its examples into one shell would still have it; stop it in the example that starts it", path, j.n, j.cmd)
	}
	s.drain()
	for _, l := range s.pending {
		t.Errorf("%s: job %%%d (%s) wrote %q, which the README does not show", path, l.job.n, l.job.cmd, l.text)
	}
}

func needsRoot(b block) bool {
	for _, s := range b.steps {
		if strings.HasPrefix(s.cmd, "egret run") || strings.HasPrefix(s.cmd, "egret agent") {
			return true
		}
	}
	return false
}

// session is one README's terminal: one shell's working directory, its
// background jobs and the lines they wrote that no expected line has
// consumed yet.
type session struct {
	t         *testing.T
	file      string // the README
	dir       string
	env       []string
	subst     *strings.Replacer
	proxyPort string
	jobs      []*job       // running, or exited but not yet reaped by the shell
	lines     chan jobLine // the jobs' output, line by line
	pending   []jobLine    // lines read back from lines, not yet consumed
	id        string       // the request id last matched
}

// job is one background job of the shell.
type job struct {
	n      int    // its job number, as in %N
	cmd    string // as typed
	c      *exec.Cmd
	exited chan struct{} // closed once it exited and all its output was read
}

// jobLine is one line a job wrote.
type jobLine struct {
	job  *job
	text string
}

// reap removes the jobs that exited from the table, as a shell does at
// its next prompt.
func (s *session) reap() {
	running := s.jobs[:0]
	for _, j := range s.jobs {
		select {
		case <-j.exited:
		default:
			running = append(running, j)
		}
	}
	s.jobs = running
}

// nextJobNumber is the number bash gives a new job: one more than the
// highest of the jobs in its table, 1 when there is none.
func (s *session) nextJobNumber() int {
	n := 0
	for _, j := range s.jobs {
		n = max(n, j.n)
	}
	return n + 1
}

func (s *session) command(ctx context.Context, line string) *exec.Cmd {
	line = s.subst.Replace(line)
	line = strings.ReplaceAll(line, "<id>", s.id)
	if bare := strings.TrimPrefix(line, "exec "); strings.HasPrefix(bare, "egret proxy") && !strings.Contains(line, "--listen") {
		line = strings.Replace(line, "egret proxy", "egret proxy --listen 127.0.0.1:"+s.proxyPort, 1)
	}
	c := exec.CommandContext(ctx, "sh", "-c", line)
	c.Dir, c.Env = s.dir, s.env
	return c
}

// run runs one step and checks what it shows; false when it failed.
func (s *session) run(st step) bool {
	t := s.t
	where := fmt.Sprintf("%s:%d: $ %s", s.file, st.line, st.cmd)
	var fg []string
	var killed *job
	s.reap()
	switch {
	case killJob.MatchString(st.cmd):
		n, _ := strconv.Atoi(killJob.FindStringSubmatch(st.cmd)[1])
		for _, j := range s.jobs {
			if j.n == n {
				killed = j
			}
		}
		if killed == nil {
			t.Errorf("%s: kill: %%%d: no such job (the shell's jobs: %s)", where, n, s.jobList())
			return false
		}
		// As a shell's kill %N: the job's process group.
		syscall.Kill(-killed.c.Process.Pid, syscall.SIGTERM)
	case bgSuffix.MatchString(st.cmd):
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		// exec: the job is the command itself, so that waiting for it
		// waits for its exit (an agent's cleanup), not for a shell's.
		c := s.command(context.Background(), "exec "+bgSuffix.ReplaceAllString(st.cmd, ""))
		c.Stdout, c.Stderr = w, w
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := c.Start(); err != nil {
			t.Errorf("%s: %v", where, err)
			return false
		}
		w.Close()
		j := &job{n: s.nextJobNumber(), cmd: bgSuffix.ReplaceAllString(st.cmd, ""), c: c, exited: make(chan struct{})}
		s.jobs = append(s.jobs, j)
		go func() {
			sc := bufio.NewScanner(r)
			for sc.Scan() {
				s.lines <- jobLine{j, strings.TrimSuffix(sc.Text(), "\r")}
			}
			r.Close()
			c.Wait()
			close(j.exited)
		}()
	default:
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c := s.command(ctx, st.cmd)
		var stdout, stderr strings.Builder
		c.Stdout, c.Stderr = &stdout, &stderr
		if err := c.Run(); err != nil && !errors.As(err, new(*exec.ExitError)) {
			t.Errorf("%s: %v", where, err)
			return false
		}
		fg = append(splitLines(stderr.String()), splitLines(stdout.String())...)
	}
	if err := s.match(st.want, fg); err != nil {
		t.Errorf("%s\n%v\n%s shows:\n\t%s", where, err, s.file, strings.Join(st.want, "\n\t"))
		return false
	}
	if killed != nil {
		// The job's exit, then whatever it wrote that the README does
		// not show after the kill.
		select {
		case <-killed.exited:
		case <-time.After(lineWait):
			t.Errorf("%s: job %%%d (%s) still running %v after its SIGTERM", where, killed.n, killed.cmd, lineWait)
			return false
		}
		s.drain()
		var more []string
		rest := s.pending[:0]
		for _, l := range s.pending {
			if l.job == killed {
				more = append(more, l.text)
			} else {
				rest = append(rest, l)
			}
		}
		s.pending = rest
		if len(more) > 0 {
			t.Errorf("%s: job %%%d (%s) wrote lines the README does not show after it:\n\t%s", where, killed.n, killed.cmd, strings.Join(more, "\n\t"))
			return false
		}
		s.reap()
	}
	return true
}

// drain moves the lines the jobs wrote so far into pending.
func (s *session) drain() {
	for {
		select {
		case l := <-s.lines:
			s.pending = append(s.pending, l)
		default:
			return
		}
	}
}

func (s *session) jobList() string {
	if len(s.jobs) == 0 {
		return "none"
	}
	var l []string
	for _, j := range s.jobs {
		l = append(l, fmt.Sprintf("%%%d %s", j.n, j.cmd))
	}
	return strings.Join(l, ", ")
}

// match checks the expected lines against the command's own output, then
// the lines of the background jobs as they come.
func (s *session) match(want, fg []string) error {
	var seen []string
	next := func() (string, error) {
		if len(fg) > 0 {
			l := fg[0]
			fg = fg[1:]
			seen = append(seen, l)
			return l, nil
		}
		if len(s.pending) > 0 {
			l := s.pending[0].text
			s.pending = s.pending[1:]
			seen = append(seen, l)
			return l, nil
		}
		select {
		case l := <-s.lines:
			seen = append(seen, l.text)
			return l.text, nil
		case <-time.After(lineWait):
			return "", fmt.Errorf("no further output in %v", lineWait)
		}
	}
	report := func(err error) error {
		return fmt.Errorf("%w; the terminal showed:\n\t%s\n\t(then:) %s", err, strings.Join(seen, "\n\t"), strings.Join(fg, "\n\t"))
	}
	for i := 0; i < len(want); i++ {
		w := s.subst.Replace(want[i])
		if w == "..." {
			if i == len(want)-1 {
				return nil // the rest of the output is left out
			}
			re := s.pattern(want[i+1])
			for {
				l, err := next()
				if err != nil {
					return report(fmt.Errorf("no line matching %q: %w", want[i+1], err))
				}
				if s.accept(re, l) {
					break
				}
			}
			i++
			continue
		}
		l, err := next()
		if err != nil {
			return report(fmt.Errorf("line %q: %w", want[i], err))
		}
		if !s.accept(s.pattern(want[i]), l) {
			return report(fmt.Errorf("got %q, the README shows %q", l, want[i]))
		}
	}
	if len(fg) > 0 {
		return report(fmt.Errorf("%d more lines than the README shows", len(fg)))
	}
	return nil
}

func (s *session) pattern(want string) *regexp.Regexp {
	want = s.subst.Replace(want)
	var b strings.Builder
	b.WriteString("^")
	last := 0
	for _, m := range holeRE.FindAllStringIndex(want, -1) {
		b.WriteString(regexp.QuoteMeta(want[last:m[0]]))
		b.WriteString(holes[want[m[0]:m[1]]])
		last = m[1]
	}
	b.WriteString(regexp.QuoteMeta(want[last:]))
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

func (s *session) accept(re *regexp.Regexp, l string) bool {
	m := re.FindStringSubmatch(l)
	if m == nil {
		return false
	}
	if len(m) > 1 && m[1] != "" {
		s.id = m[1]
	}
	return true
}

// stopJobs ends the jobs still running (SIGTERM to their process group, then
// SIGKILL) and waits for them.
func (s *session) stopJobs() {
	// The readers block on a full channel; keep reading while waiting.
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-s.lines:
			case <-stop:
				return
			}
		}
	}()
	defer close(stop)
	for _, j := range s.jobs {
		syscall.Kill(-j.c.Process.Pid, syscall.SIGTERM)
		select {
		case <-j.exited:
		case <-time.After(20 * time.Second):
			syscall.Kill(-j.c.Process.Pid, syscall.SIGKILL)
			<-j.exited
		}
	}
	s.jobs = nil
}

func splitLines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSuffix(l, "\r") // a terminal shows no CR
	}
	return lines
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, p, _ := net.SplitHostPort(l.Addr().String())
	return p
}

func randHex(t *testing.T) string {
	b := make([]byte, 4)
	if _, err := io.ReadFull(rand.Reader, b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func isCgroup2(dir string) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(dir, &st) == nil && st.Type == 0x63677270 // CGROUP2_SUPER_MAGIC
}
