// Command xe is the command line of a toolstackd (or xapi) pool: a thin
// client that sends its arguments to the server's POST /cli and does what
// the server says. See `xe help`.
//
// Connection: -s <server> (TLS on port 443 unless the server is this host
// or --nossl is given; -p <port> to change the port), -u/-pw or -pwf
// <file> (user on line 1, password on line 2), the same as server=,
// port=, username=, password=, passwordfile=, nossl=; ~/.xe holds
// key=value defaults and XE_EXTRA_ARGS comma-separated ones (the command
// line wins, then XE_EXTRA_ARGS, then ~/.xe). Without a server, xe talks
// to the local daemon over its superuser socket, found at
// $TOOLSTACKD_SOCKET, $TOOLSTACKD_DATA_DIR/xapi.sock, the daemon's
// default data directories, or /var/lib/xcp/xapi.
//
// `xe completion bash` prints a bash completion script; completions come
// from the server (commands, parameters, uuids, names).
package main

import (
	"os"
	"strings"

	"github.com/spf13/cobra"

	"toolstackd/internal/cli/xe"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	code := 0
	client := xe.New()
	root := &cobra.Command{
		Use:   "xe <command> [options] [name=value ...]",
		Short: "Command line for a toolstackd (or xapi) pool",
		// xe's own options (-s, -pw, -pwf, name=value) are not POSIX
		// flags: the client reads them itself.
		DisableFlagParsing: true,
		Args:               cobra.ArbitraryArgs,
		SilenceErrors:      true,
		SilenceUsage:       true,
		Run: func(_ *cobra.Command, args []string) {
			code = client.Run(args)
		},
		ValidArgsFunction: func(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			words, noSpace := client.Complete(args, toComplete)
			dir := cobra.ShellCompDirectiveNoFileComp
			if noSpace {
				dir |= cobra.ShellCompDirectiveNoSpace
			}
			if fileParam(toComplete) {
				return nil, cobra.ShellCompDirectiveDefault
			}
			return words, dir
		},
	}
	// "xe help" is the server's; cobra's own help command would hide it.
	root.SetHelpCommand(&cobra.Command{Use: "__cobra_help", Hidden: true})
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(&cobra.Command{
		Use:       "completion bash",
		Short:     "Prints a bash completion script for xe",
		Hidden:    true,
		ValidArgs: []string{"bash"},
		Args:      cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return root.GenBashCompletionV2(os.Stdout, false)
		},
	})
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		_, _ = os.Stderr.WriteString("Error: " + err.Error() + "\n")
		return 1
	}
	return code
}

// fileParam reports whether a word being completed is the value of a
// file name parameter, which the shell completes from the file system.
func fileParam(word string) bool {
	return strings.HasPrefix(word, "filename=") || strings.HasPrefix(word, "file-name=")
}
