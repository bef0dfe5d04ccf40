package witness

import (
	"sync"
	"syscall"
)

// Memory is an in-memory Witness for tests: Snapshot answers from a script
// of counters, one entry a call, repeating the last entry once the script is
// used up. It ignores the connection it is given.
type Memory struct {
	mu     sync.Mutex
	script []Counters
	err    error
	calls  int
}

var _ Witness = (*Memory)(nil)

// NewMemory returns a Memory that answers with script in order.
func NewMemory(script ...Counters) *Memory { return &Memory{script: script} }

// Set replaces the script.
func (m *Memory) Set(script ...Counters) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.script, m.calls = script, 0
}

// Fail makes every later Snapshot return err (nil restores the script).
func (m *Memory) Fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.err = err
}

// Calls returns how many snapshots were taken.
func (m *Memory) Calls() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}

// Snapshot returns the next counters of the script.
func (m *Memory) Snapshot(syscall.RawConn) (Counters, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := m.calls
	m.calls++
	if m.err != nil {
		return Counters{}, m.err
	}
	if len(m.script) == 0 {
		return Counters{}, ErrUnsupported
	}
	if i >= len(m.script) {
		i = len(m.script) - 1
	}
	c := m.script[i]
	if c.Source == "" {
		c.Source = "memory"
	}
	return c, nil
}
