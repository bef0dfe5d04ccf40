package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// runbookBase is where the alerts' runbook_url point: deploy/README.md as
// the repository's web page shows it.
const runbookBase = "https://github.com/egret-proxy/egret/blob/main/deploy/README.md#"

// githubAnchor is the anchor GitHub gives a Markdown heading: lower case,
// punctuation but hyphens and underscores dropped, spaces made hyphens.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func TestGithubAnchor(t *testing.T) {
	for h, want := range map[string]string{
		"EgretAgentDown": "egretagentdown",
		"Restart or uninstall: how the agent tells them apart": "restart-or-uninstall-how-the-agent-tells-them-apart",
		"Try it in VMs: the Vagrantfile":                       "try-it-in-vms-the-vagrantfile",
	} {
		if got := githubAnchor(h); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", h, got, want)
		}
	}
}

// readmeSections returns deploy/README.md's sections by the anchor of their
// heading: the text up to the next heading of the same or a higher level.
func readmeSections(t testing.TB) map[string]string {
	t.Helper()
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	heading := regexp.MustCompile(`^(#{1,6}) (.*)$`)
	type open struct {
		level  int
		anchor string
		body   strings.Builder
	}
	sections := map[string]string{}
	var stack []*open
	inFence := false
	closeTo := func(level int) {
		for len(stack) > 0 && stack[len(stack)-1].level >= level {
			s := stack[len(stack)-1]
			sections[s.anchor] = s.body.String()
			stack = stack[:len(stack)-1]
		}
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if m := heading.FindStringSubmatch(line); m != nil && !inFence {
			closeTo(len(m[1]))
			for _, s := range stack {
				s.body.WriteString(line + "\n")
			}
			stack = append(stack, &open{level: len(m[1]), anchor: githubAnchor(m[2])})
			continue
		}
		for _, s := range stack {
			s.body.WriteString(line + "\n")
		}
	}
	closeTo(1)
	return sections
}

// Every alert links to its runbook in deploy/README.md, and every runbook
// there says what the alert means, what to check and what to do.
func TestAlertRunbooks(t *testing.T) {
	sections := readmeSections(t)
	runbooks, ok := sections["runbooks"]
	if !ok {
		t.Fatal("deploy/README.md has no Runbooks section")
	}
	alerts := map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			u := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(u, runbookBase)
			if !ok || anchor != githubAnchor(r.Alert) {
				t.Errorf("%s: runbook_url %q, want %s%s", r.Alert, u, runbookBase, githubAnchor(r.Alert))
				continue
			}
			body, ok := sections[anchor]
			if !ok || !strings.Contains(runbooks, "### "+r.Alert+"\n") {
				t.Errorf("%s: no section %q under Runbooks in deploy/README.md", r.Alert, r.Alert)
				continue
			}
			for _, part := range []string{"**What it means.**", "**What to check.**", "**What to do.**"} {
				if !strings.Contains(body, part) {
					t.Errorf("%s's runbook does not say %s", r.Alert, part)
				}
			}
		}
	}
	// No runbook of an alert that is gone.
	for _, m := range regexp.MustCompile(`(?m)^### (\S+)$`).FindAllStringSubmatch(runbooks, -1) {
		if !alerts[m[1]] {
			t.Errorf("runbook %s: no such alert in %s", m[1], rulesFile)
		}
	}
}
