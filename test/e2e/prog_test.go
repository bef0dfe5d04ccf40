package e2e

import (
	"errors"
	"log/slog"
	"os"
	"testing"

	"github.com/cilium/ebpf"
)

func progExists(id uint32) bool {
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	p.Close()
	return true
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(b[:len(b)-1]))
	return len(b), nil
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("EGRET_E2E_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}
