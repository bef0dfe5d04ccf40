// Package truth holds the truth suite: 10,000 mixed requests through the
// real proxy to the ledger upstream, each answer checked against what the
// ledger executed (egret never says a request did not run when it did, and
// never runs a non-idempotent one twice), and the outage test. It has no
// code outside its tests.
package truth
