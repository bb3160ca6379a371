package xe

import (
	"bytes"
	"strings"
)

// Shell completion asks the server, as xapi's completion script does:
// command names from "help --minimal --all", a command's parameters from
// "help <command>", and values (uuids, names, field names) from the
// matching list command with --minimal.

// query runs an xe command line quietly and returns its output when it
// succeeds.
func (cl *Client) query(args ...string) (string, bool) {
	var out bytes.Buffer
	q := *cl
	q.Stdout, q.Stderr, q.Progress, q.Stdin = &out, &bytes.Buffer{}, false, strings.NewReader("")
	code := q.Run(args)
	return strings.TrimRight(out.String(), "\n"), code == 0
}

// splitMinimal splits --minimal output at unescaped commas.
func splitMinimal(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			cur.WriteByte(s[i+1])
			i++
		case s[i] == ',':
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	return append(out, cur.String())
}

// classOfCommand guesses the class a command acts on, for uuid=: the
// part before "-param-", or the first word (two for the classes whose
// names have a dash).
func classOfCommand(cmd string) string {
	if i := strings.Index(cmd, "-param-"); i > 0 {
		return cmd[:i]
	}
	if i := strings.LastIndex(cmd, "-list"); i > 0 && i == len(cmd)-5 {
		return cmd[:i]
	}
	parts := strings.Split(cmd, "-")
	switch {
	case len(parts) >= 3 && (parts[0] == "host" && (parts[1] == "cpu" || parts[1] == "crashdump") ||
		parts[0] == "gpu" && parts[1] == "group" || parts[0] == "vgpu" && parts[1] == "type"):
		return parts[0] + "-" + parts[1]
	case cmd == "diagnostic-vm-status":
		return "vm"
	case cmd == "diagnostic-vdi-status":
		return "vdi"
	}
	return parts[0]
}

// optionTakesValue reports whether a word is one of xe's options that
// consume the next word.
func optionTakesValue(w string) bool { _, ok := valueSwitches[w]; return ok }

// Complete returns completions for the word being typed (toComplete)
// after the words before it (without the program name). The bool asks
// the shell not to add a space (a parameter name ending in = or :).
func (cl *Client) Complete(words []string, toComplete string) ([]string, bool) {
	// The connection options typed so far apply to the queries.
	var opts, rest []string
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case optionTakesValue(w) && i+1 < len(words):
			opts = append(opts, w, words[i+1])
			i++
		case flagSwitches[w] != "":
			opts = append(opts, w)
		default:
			k, _, ok := strings.Cut(w, "=")
			if ok {
				if known, _ := (&Options{}).setKeyword(k, "0"); known {
					opts = append(opts, w)
					continue
				}
			}
			rest = append(rest, w)
		}
	}
	ask := func(args ...string) []string {
		out, ok := cl.query(append(args, opts...)...)
		if !ok {
			return nil
		}
		return splitMinimal(out)
	}
	prefixed := func(items []string, prefix string) []string {
		var out []string
		for _, it := range items {
			if strings.HasPrefix(it, prefix) {
				out = append(out, it)
			}
		}
		return out
	}
	if len(rest) == 0 {
		return prefixed(ask("help", "--minimal", "--all"), toComplete), false
	}
	cmd := rest[0]
	if k, v, ok := strings.Cut(toComplete, "="); ok {
		var vals []string
		switch {
		case k == "uuid":
			vals = ask(classOfCommand(cmd)+"-list", "params=uuid", "--minimal")
		case strings.HasSuffix(k, "-uuid"):
			class := strings.TrimSuffix(k, "-uuid")
			if class == "snapshot" {
				vals = ask(class+"-list", "params=uuid", "--minimal")
			} else {
				vals = ask(class+"-list", "--all", "params=uuid", "--minimal")
			}
		case k == "vm":
			vals = ask("vm-list", "params=name-label", "--minimal")
		case k == "host" || k == "on":
			vals = ask("host-list", "params=name-label", "--minimal")
		case k == "sr" || k == "sr-name-label":
			vals = ask("sr-list", "params=name-label", "--minimal")
		case k == "template":
			vals = ask("template-list", "params=name-label", "--minimal")
		case k == "params" || k == "param-name":
			class := classOfCommand(cmd)
			for _, p := range ask("help", class+"-list", "--minimal") {
				if p != "params" && !strings.HasSuffix(p, ":") && !strings.Contains(p, ":contains") {
					vals = append(vals, p)
				}
			}
			if k == "params" {
				vals = append(vals, "all")
			}
		}
		var out []string
		for _, it := range prefixed(vals, v) {
			out = append(out, k+"="+it)
		}
		return out, false
	}
	var names []string
	for _, p := range ask("help", cmd, "--minimal") {
		if strings.HasSuffix(p, ":") {
			names = append(names, p)
		} else {
			names = append(names, p+"=")
		}
	}
	// Selector commands say so in their help.
	if out, ok := cl.query(append([]string{"help", cmd}, opts...)...); ok {
		for _, sel := range []struct{ marker, param string }{{"<vm-selectors>", "vm="}, {"<host-selectors>", "host="}, {"<sr-selectors>", "sr="}} {
			if strings.Contains(out, sel.marker) {
				names = append(names, sel.param)
			}
		}
	}
	names = append(names, "--minimal", "--force", "--multiple")
	return prefixed(names, toComplete), true
}
