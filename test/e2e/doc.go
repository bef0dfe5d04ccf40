// Package e2e holds root end-to-end tests of egret's node agent, `egret run`
// and the kernel witness on a real kernel: pods made of cgroups and network
// namespaces the tests create (random names, removed in t.Cleanup), plain
// clients (curl, net/http) and the ledger upstream. See README.md.
package e2e
