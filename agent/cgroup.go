package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/egret-proxy/egret/agent/bpfload"
)

// ErrCgroup: a cgroup v2 operation the agent needs failed.
var ErrCgroup = errors.New("agent: cgroup")

// DefaultSelfCgroup is where a node agent started in the root cgroup moves
// itself: egret's own programs must not be attached to the root, which
// would make them run for every socket of the node.
var DefaultSelfCgroup = bpfload.CgroupRoot + "/egret-agent"

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

// SelfCgroupFor returns the cgroup the agent should use as its own: the
// one it is in, unless that is the root, in which case it moves itself to
// fallback.
func SelfCgroupFor(fallback string) (string, error) {
	cur, err := CurrentCgroup()
	if err != nil {
		return "", err
	}
	if filepath.Clean(cur) != filepath.Clean(bpfload.CgroupRoot) && !strings.HasSuffix(cur, "/") {
		return cur, nil
	}
	if err := EnterCgroup(fallback); err != nil {
		return "", err
	}
	return fallback, nil
}
