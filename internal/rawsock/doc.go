// Package rawsock makes a TCP connection's reads and writes without the
// scheduler's system-call bookkeeping.
//
// A read or write through net.Conn enters the Go scheduler's "in a system
// call" state, and the first one after the process was idle wakes the
// runtime's monitor thread, which then polls every 20 µs until the process
// is idle again. A proxy carrying a few thousand requests a second goes
// idle and busy once per request, so the monitor's wake-ups outnumbered
// the proxy's own context switches. The calls on a non-blocking socket
// never block, so they need none of it: Wrap makes them raw system calls
// through the connection's syscall.RawConn, and the poller still waits for
// readiness, honours deadlines and Close.
//
// On other systems Wrap returns the connection unchanged.
package rawsock
