package cli

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// The completion scripts ask egret itself what may come next: the words
// typed so far, then urfave/cli's --generate-bash-completion, which prints
// the subcommands (or, after a word starting with "-", the flags) one a
// line. So they stay right as commands and flags change.
var completionScripts = map[string]string{
	"bash": `# bash completion for egret: source <(egret completion bash)
_egret_complete() {
	local cur=${COMP_WORDS[COMP_CWORD]}
	local args=("${COMP_WORDS[@]:1:COMP_CWORD-1}")
	if [[ $cur == -* ]]; then
		args+=("$cur")
	fi
	local IFS=$'\n'
	COMPREPLY=($(compgen -W "$("${COMP_WORDS[0]}" "${args[@]}" --generate-bash-completion 2>/dev/null)" -- "$cur"))
}
complete -o default -F _egret_complete egret
`,
	"zsh": `#compdef egret
# zsh completion for egret: source <(egret completion zsh), after compinit;
# or save it as _egret in a directory of $fpath.
_egret() {
	local cur=${words[CURRENT]}
	local -a args opts
	args=(${words[2,CURRENT-1]})
	if [[ $cur == -* ]]; then
		args+=($cur)
	fi
	opts=(${(f)"$(${words[1]} $args --generate-bash-completion 2>/dev/null)"})
	if (( ${#opts} )); then
		compadd -- $opts
	else
		_files
	fi
}
if (( $+functions[compdef] )); then
	compdef _egret egret
fi
`,
	"fish": `# fish completion for egret: egret completion fish | source
# (or save it as ~/.config/fish/completions/egret.fish)
function __egret_complete
	set -l args (commandline -opc)
	set -l egret $args[1]
	set -e args[1]
	set -l cur (commandline -ct)
	if string match -q -- '-*' $cur
		set -a args $cur
	end
	$egret $args --generate-bash-completion 2>/dev/null
end
complete -c egret -f -a '(__egret_complete)'
`,
}

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print the shell completion script for bash, zsh or fish",
		ArgsUsage: "bash|zsh|fish",
		Description: "bash:  source <(egret completion bash)     (in ~/.bashrc)\n" +
			"zsh:   source <(egret completion zsh)      (in ~/.zshrc, after compinit)\n" +
			"fish:  egret completion fish | source      (or save it as ~/.config/fish/completions/egret.fish)",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usage("completion needs one shell: bash, zsh or fish")
			}
			s, ok := completionScripts[c.Args().First()]
			if !ok {
				return usage("completion %q: expected bash, zsh or fish", c.Args().First())
			}
			_, err := fmt.Fprint(c.App.Writer, s)
			return err
		},
		BashComplete: func(c *cli.Context) {
			fmt.Fprintln(c.App.Writer, strings.Join([]string{"bash", "zsh", "fish"}, "\n"))
		},
	}
}
