package agent

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/egret-proxy/egret/agent/bpfload"
	"github.com/egret-proxy/egret/internal/cgroup2"
)

// ErrCgroup: a cgroup v2 operation the agent needs failed.
var ErrCgroup = errors.New("agent: cgroup")

// DefaultSelfCgroup is where a node agent with the default pin dir that
// does not start in a cgroup of its own moves itself: egret's own programs
// must not be attached to the root, which would make them run for every
// socket of the node. An agent with another pin dir gets another cgroup
// (SelfCgroupFor).
var DefaultSelfCgroup = cgroup2.Root() + "/egret-agent"

// SelfCgroupFor is the cgroup an agent whose pinned state lives in pinDir
// moves itself to when it does not start in a cgroup of its own:
// DefaultSelfCgroup for bpfload.DefaultPinDir, else ROOT/egret-agent-NAME-HASH
// (NAME the pin dir's last element, HASH 8 hex digits of its clean path).
// Two agents on one host have two pin dirs (each adopts what its pin dir
// holds), so they never share a cgroup, nor the getsockopt and witness
// programs attached to it.
func SelfCgroupFor(pinDir string) string {
	pinDir = filepath.Clean(pinDir)
	if pinDir == filepath.Clean(bpfload.DefaultPinDir) {
		return DefaultSelfCgroup
	}
	sum := sha256.Sum256([]byte(pinDir))
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, filepath.Base(pinDir))
	if len(name) > 40 {
		name = name[:40]
	}
	return filepath.Join(cgroup2.Root(), fmt.Sprintf("egret-agent-%s-%x", name, sum[:4]))
}

// CurrentCgroup returns the cgroup v2 directory of the calling process.
func CurrentCgroup() (string, error) {
	p, err := bpfload.SelfCgroup()
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrCgroup, err)
	}
	return filepath.Clean(p), nil
}

// EnterCgroup creates dir if needed and moves the whole calling process
// into it. Sockets are charged to the cgroup of the process that creates
// them, so after this every listener and upstream socket the agent makes
// belongs to dir.
func EnterCgroup(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("%w: create %s: %v", ErrCgroup, dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return fmt.Errorf("%w: move into %s: %v", ErrCgroup, dir, err)
	}
	return nil
}

// EnterSelfCgroup puts the agent in a cgroup of its own and returns it:
// the one it is in when it is alone there and that is not the root, else
// fallback (SelfCgroupFor), which it creates if needed and moves to. An
// agent started from a shell shares the shell's cgroup, and two agents
// started from one shell would share it: both move out instead.
func EnterSelfCgroup(fallback string) (string, error) {
	cur, err := CurrentCgroup()
	if err != nil {
		return "", err
	}
	if filepath.Clean(cur) != filepath.Clean(cgroup2.Root()) && !strings.HasSuffix(cur, "/") && alone(cur) {
		return cur, nil
	}
	if err := EnterCgroup(fallback); err != nil {
		return "", err
	}
	return fallback, nil
}

// alone reports whether the calling process is the only one in dir.
func alone(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return false
	}
	return strings.TrimSpace(string(b)) == strconv.Itoa(os.Getpid())
}
