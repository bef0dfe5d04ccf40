// Package readme holds TestREADMEExamples, which runs every command example
// of the top README.md against a built egret and a real ledger and fails
// when what they show differs from what the README says (see its test file
// for the README's conventions: "$ " commands, "...", and the <id>, <hex>,
// <n>, <port>, <duration>, <time> placeholders).
package readme
