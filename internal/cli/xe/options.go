// Package xe is the xe client: it reads xe's connection options, sends
// the remaining arguments to a server's POST /cli, and then does what the
// server tells it over the thin-CLI protocol (package proto) until told
// to exit: print, read a named file, upload or download one over HTTP,
// read a line from the user, attach the terminal to a console.
package xe

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Options are how to reach the server and whom to log in as.
type Options struct {
	Server      string
	ServerSet   bool // Server was given (otherwise: this host, over the local socket if there is one)
	Port        int  // 0: 443 with TLS, 80 without
	User        string
	Password    string
	PassFile    string
	NoSSL       bool
	CAFile      string // CAs (PEM) the server may chain to besides the system's: --cafile, cafile=, $XE_CA_FILE
	NoVerify    bool   // do not check the server's certificate: --no-verify, noverify=
	Debug       bool
	DebugOnFail bool
	Traceparent string
}

// defaultOptions are xe's: root, with the password "null", on this host.
func defaultOptions() Options {
	return Options{Server: "127.0.0.1", User: "root", Password: "null"}
}

// usageError asks for the usage text and exit status 0, as xe does for
// --help; a non-empty msg is printed first and makes the status 1.
type usageError struct{ msg string }

func (e *usageError) Error() string { return "usage: " + e.msg }

// setKeyword applies one of xe's own settings; it reports false for a
// key that is not one (and is therefore an argument for the server).
func (o *Options) setKeyword(k, v string) (bool, error) {
	switch k {
	case "server":
		o.Server, o.ServerSet = v, true
	case "port":
		p, err := strconv.Atoi(v)
		if err != nil || p < 0 || p > 65535 {
			return true, &usageError{"Port number must be an integer (0-65535)"}
		}
		o.Port = p
	case "username":
		o.User = v
	case "password":
		o.Password = v
	case "passwordfile":
		o.PassFile = v
	case "nossl":
		b, err := strconv.ParseBool(v)
		if err != nil {
			return true, &usageError{fmt.Sprintf("nossl must be true or false, not %q", v)}
		}
		o.NoSSL = b
	case "cafile":
		o.CAFile = v
	case "noverify":
		b, err := strconv.ParseBool(v)
		if err != nil {
			return true, &usageError{fmt.Sprintf("noverify must be true or false, not %q", v)}
		}
		o.NoVerify = b
	case "debug":
		o.Debug, _ = strconv.ParseBool(v)
	case "debugonfail":
		o.DebugOnFail, _ = strconv.ParseBool(v)
	case "traceparent":
		o.Traceparent = v
	default:
		return false, nil
	}
	return true, nil
}

// optionSwitches are xe's dash options: those that take a value, and
// those that stand alone.
var (
	valueSwitches = map[string]string{
		"-s": "server", "-h": "server", "-p": "port", "-u": "username", "-pw": "password", "-pwf": "passwordfile",
		"--traceparent": "traceparent", "--cafile": "cafile",
	}
	flagSwitches = map[string]string{"--nossl": "nossl", "--no-verify": "noverify", "--debug": "debug", "--debug-on-fail": "debugonfail"}
)

// processArgs applies xe's own options in args and returns the rest, in
// order.
func (o *Options) processArgs(args []string) ([]string, error) {
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if k, ok := valueSwitches[a]; ok && i+1 < len(args) {
			if _, err := o.setKeyword(k, args[i+1]); err != nil {
				return nil, err
			}
			i++
			continue
		}
		if k, ok := flagSwitches[a]; ok {
			_, _ = o.setKeyword(k, "true") // a switch sets a boolean keyword: "true" cannot be refused
			continue
		}
		if k, v, ok := strings.Cut(a, "="); ok {
			known, err := o.setKeyword(k, v)
			if err != nil {
				return nil, err
			}
			if known {
				continue
			}
		}
		rest = append(rest, a)
	}
	return rest, nil
}

// splitExtraArgs splits XE_EXTRA_ARGS at commas; "\," is a comma inside
// an argument.
func splitExtraArgs(s string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s) && s[i+1] == ',':
			cur.WriteByte(',')
			i++
		case s[i] == ',':
			if cur.Len() > 0 {
				out = append(out, cur.String())
			}
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

// readRC reads ~/.xe: one key=value per line; blank lines and lines
// starting with # are skipped.
func readRC(path string) ([][2]string, error) {
	f, err := os.Open(path) //nolint:gosec // the xe user's own ~/.xe
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	defer func(c func() error) { _ = c() }(f.Close)
	var out [][2]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			out = append(out, [2]string{strings.TrimSpace(k), strings.TrimSpace(v)})
		}
	}
	return out, sc.Err()
}

// parseCommandLine works out the options and the server's arguments from
// the command line, XE_EXTRA_ARGS and ~/.xe (in that order of priority,
// over the defaults). Arguments that are not options go to the server:
// the command line's first, then the others'.
func (cl *Client) parseCommandLine(args []string) (Options, []string, error) {
	o := defaultOptions()
	var rcRest []string
	if cl.Home != "" {
		rc, err := readRC(filepath.Join(cl.Home, ".xe"))
		if err != nil {
			return o, nil, fmt.Errorf("reading ~/.xe: %w", err)
		}
		for _, kv := range rc {
			known, err := o.setKeyword(kv[0], kv[1])
			if err != nil {
				return o, nil, err
			}
			if !known {
				rcRest = append(rcRest, kv[0]+"="+kv[1])
			}
		}
	}
	extraRest, err := o.processArgs(splitExtraArgs(cl.getenv("XE_EXTRA_ARGS")))
	if err != nil {
		return o, nil, err
	}
	if tp := cl.getenv("TRACEPARENT"); tp != "" {
		o.Traceparent = tp
	}
	for _, a := range args {
		if a == "-help" || a == "--help" {
			return o, nil, &usageError{}
		}
	}
	rest, err := o.processArgs(args)
	if err != nil {
		return o, nil, err
	}
	if o.PassFile != "" {
		if err := o.readPasswordFile(); err != nil {
			return o, nil, err
		}
	}
	return o, append(append(rest, extraRest...), rcRest...), nil
}

// readPasswordFile reads the user name (line 1) and password (line 2).
func (o *Options) readPasswordFile() error {
	b, err := os.ReadFile(o.PassFile)
	if err != nil {
		return &fatalError{fmt.Sprintf("Error opening password file '%s'\n", o.PassFile)}
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 2 || (len(lines) == 2 && lines[1] == "") {
		return &fatalError{"Error: password file format: expecting username on the first line, password on the second line\n"}
	}
	o.User, o.Password = strings.TrimSuffix(lines[0], "\r"), strings.TrimSuffix(lines[1], "\r")
	return nil
}
