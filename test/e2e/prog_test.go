package e2e

import (
	"log/slog"
	"os"
	"testing"
)

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(b[:len(b)-1]))
	return len(b), nil
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("EGRET_E2E_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}
