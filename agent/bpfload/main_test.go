package bpfload_test

import (
	"os"
	"testing"

	"github.com/egret-proxy/egret/agent/bpfload/bpftest"
)

func TestMain(m *testing.M) {
	bpftest.RunChildIfRequested()
	os.Exit(m.Run())
}
