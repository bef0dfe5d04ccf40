// Package readme holds TestREADMEExamples, which runs the command examples
// of every README.md of the repository against a built egret and a real
// ledger and fails when what they show differs from what the README says
// (see its test file for the conventions: "$ " commands, "...", and the
// <id>, <hex>, <n>, <port>, <ip>, <duration>, <time> placeholders), and
// TestREADMERules, which fails when a shell example is neither run nor
// marked "<!-- not run: WHY -->".
package readme
