package cli

import (
	"strings"
)

// param is one key=value argument, in command-line order.
type param struct{ k, v string }

// splitBody turns a request body into its arguments: one per line, a
// trailing CR dropped, and a first line "session_id=<ref>" taken as the
// session to run as (a forwarded request) instead of an argument.
func splitBody(body string) (session string, args []string) {
	lines := strings.Split(body, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSuffix(l, "\r")
	}
	// The final newline of a body ends the last line; it does not start
	// an empty argument.
	if n := len(lines); n > 0 && lines[n-1] == "" {
		lines = lines[:n-1]
	}
	if len(lines) > 0 {
		if ref, ok := strings.CutPrefix(lines[0], "session_id="); ok {
			return ref, lines[1:]
		}
	}
	return "", lines
}

// switches are the dash-options a command line may carry as "-x value"
// pairs, and the parameter each stands for.
var switches = map[string]string{
	"-u": "username", "-pw": "password", "-s": "server", "-h": "server", "-p": "port",
}

// parseArgs reads the command name and its parameters: "--x" is x=true,
// "-x v" is a known switch with its value, "k=v" splits at the first
// "=". A bare word is accepted only where a command takes positional
// words (help); elsewhere it is a syntax error, reported by the caller
// once the command is known.
func parseArgs(args []string) (name string, params []param, bare []string, err error) {
	for len(args) > 0 && args[0] == "" {
		args = args[1:]
	}
	if len(args) == 0 {
		return "", nil, nil, syntaxError("command name is missing")
	}
	name = args[0]
	if strings.Contains(name, "=") {
		return "", nil, nil, syntaxError("command name is missing")
	}
	rest := args[1:]
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		switch {
		case a == "":
		case strings.HasPrefix(a, "--"):
			k := a[2:]
			if k == "" {
				return "", nil, nil, syntaxError("empty switch '--'")
			}
			params = append(params, param{k, "true"})
		case strings.HasPrefix(a, "-") && !strings.Contains(a, "="):
			k, ok := switches[a]
			if !ok {
				return "", nil, nil, syntaxError("Unknown switch: " + a)
			}
			if i+1 >= len(rest) {
				return "", nil, nil, syntaxError("Switch " + a + " requires a parameter")
			}
			i++
			params = append(params, param{k, rest[i]})
		default:
			k, v, ok := strings.Cut(a, "=")
			if !ok {
				bare = append(bare, a)
				continue
			}
			if k == "" {
				return "", nil, nil, syntaxError("malformed argument '" + a + "': the parameter name is missing")
			}
			params = append(params, param{k, v})
		}
	}
	return name, params, bare, nil
}

// standardParams may be given to any command.
var standardParams = map[string]bool{
	"server": true, "password": true, "port": true, "username": true, "minimal": true, "force": true,
	"multiple": true, "all": true, "message-priority": true, "trace": true,
}

// parseBool reads a boolean as xe accepts it.
func parseBool(s string) (bool, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true", "yes", "on", "1":
		return true, true
	case "false", "no", "off", "0":
		return false, true
	}
	return false, false
}
