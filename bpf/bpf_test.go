package bpf

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// TestLoadVerifier loads every program into the running kernel so that a
// verifier rejection shows up here with its log.
func TestLoadVerifier(t *testing.T) {
	testenv.RequireRoot(t)
	spec, err := LoadEgret()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	var objs EgretObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("verifier: %+v", ve)
		}
		t.Fatal(err)
	}
	defer objs.Close()
}
