package proxy

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egret-proxy/egret/internal/rawsock"
)

// TestShutdownCutMeetsANewConnection: a connection accepted as the grace
// ends, whose goroutine first runs after the cut. A request already in its
// socket is read and answered 503 not-sent (and logged), not reset unread;
// with nothing there, the connection ends at once and cleanly, without
// waiting for a request (IdleTimeout is 10 minutes here).
func TestShutdownCutMeetsANewConnection(t *testing.T) {
	for _, tc := range []struct {
		name, raw, want string
		logged          int
	}{
		{"request already here", "GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: x\r\n\r\n", "503 not-sent", 1},
		{"nothing sent", "", "eof", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &lines{}
			s, err := New(Config{Logger: slog.New(log), Timeouts: Timeouts{AnswerGrace: testAnswerGrace, IdleTimeout: 10 * time.Minute}})
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			client, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			client.SetDeadline(time.Now().Add(time.Minute)) // only a broken test's
			sc, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			if tc.raw != "" {
				io.WriteString(client, tc.raw)
				waitReadable(t, sc)
			}
			// The cut, as cutInFlight makes it, before the connection is
			// registered and served.
			s.Drain()
			s.closing.Store(true)
			s.cut.Store(true)
			s.cancel()
			c := s.newConn(rawsock.Wrap(sc))
			done := make(chan struct{})
			go func() { c.serve(); close(done) }()
			got := answerOf(bufio.NewReader(client), "GET", nil)
			if got != tc.want {
				t.Errorf("client got %q, want %q", got, tc.want)
				sc.Close() // the connection's goroutine may wait still
			}
			<-done
			if l := log.byOutcome(); l["not-sent"] != tc.logged || len(l) > 1 {
				t.Errorf("log lines %v, want %d not-sent", l, tc.logged)
			}
		})
	}
}

// waitReadable waits until the kernel has bytes for c to read.
func waitReadable(t *testing.T, c net.Conn) {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var perr error
	rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, perr = unix.Poll(pfd, int(time.Minute.Milliseconds()))
			if perr != unix.EINTR {
				return
			}
		}
	})
	if n != 1 || perr != nil {
		t.Fatal(fmt.Sprint("the request did not arrive: ", n, perr))
	}
}
