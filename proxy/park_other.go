//go:build !linux

package proxy

// Parking idle connections needs epoll (park_linux.go): elsewhere an idle
// keep-alive connection keeps its goroutine, waiting in its read.
type parker struct{}

type parkState struct{}

func sharedParker() (*parker, error) { return nil, nil }

func (p *parker) park(*conn) bool   { return false }
func (p *parker) unpark(*conn) bool { return false }
