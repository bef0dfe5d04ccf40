package toolbuild

import "testing"

// The version a go.mod requires, in a block or alone; replace lines and
// modules it does not require give none.
func TestModVersion(t *testing.T) {
	mod := []byte("module x\n\nrequire helm.sh/helm/v3 v3.22.0\n\nrequire (\n\tk8s.io/client-go v0.37.0 // indirect\n\tk8s.io/client-go-extra v0.1.0\n)\n\nreplace k8s.io/api => k8s.io/api v0.37.0\n")
	for module, want := range map[string]string{
		"helm.sh/helm/v3":  "v3.22.0",
		"k8s.io/client-go": "v0.37.0",
		"k8s.io/api":       "",
		"k8s.io/kubectl":   "",
	} {
		if got := ModVersion(mod, module); got != want {
			t.Errorf("ModVersion(%s) = %q, want %q", module, got, want)
		}
	}
}
