//go:build linux

package agent

import (
	"net"
	"testing"
	"time"
)

// TestWaitAcceptedSeesTheQueue: connections the listener has not accepted
// yet are seen in its accept queue; waitAccepted waits for them to be
// accepted (closing the listener first would reset them).
func TestWaitAcceptedSeesTheQueue(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	al := newAcceptListener(ln)
	if n, ok := acceptQueue(ln); !ok || n != 0 {
		t.Fatalf("empty queue: %d %v", n, ok)
	}
	var clients []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	if n, ok := acceptQueue(ln); !ok || n != 3 {
		t.Fatalf("queue %d %v, want 3 waiting connections", n, ok)
	}
	if waitAccepted([]*acceptListener{al}, 20*time.Millisecond) {
		t.Fatal("waitAccepted returned with connections still queued")
	}
	go func() {
		time.Sleep(30 * time.Millisecond) // not synchronisation: the accepts come late, the wait the test measures
		for range 3 {
			if c, err := al.Accept(); err == nil {
				defer c.Close()
			}
		}
		time.Sleep(time.Second) // not synchronisation: keep them open while the test looks
	}()
	start := time.Now()
	if !waitAccepted([]*acceptListener{al}, 5*time.Second) {
		t.Fatal("the queue never emptied")
	}
	if d := time.Since(start); d < 25*time.Millisecond {
		t.Fatalf("returned after %v, before the connections were accepted", d)
	}
	// A connection accepted before the close is not reset by it.
	ln.Close()
	clients[0].SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := clients[0].Read(make([]byte, 1)); err == nil || !isTimeout(err) {
		t.Fatalf("client read after the listener closed: %v (want a timeout, not a reset)", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
