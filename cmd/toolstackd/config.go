package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The configuration file (--config PATH; the service's is
// /etc/toolstackd/toolstackd.conf) holds the daemon's settings, one per
// line as "name = value", where every name is a command-line flag's name
// without its dashes. Lines starting with '#' are comments; there are no
// comments after a value, since a value may contain '#'. A value may be
// written in double quotes (Go's escapes) to keep spaces at either end.
// A flag given on the command line wins over the file. An unknown name, a
// name given twice or a value the flag refuses is an error naming the
// file and line.

// Bounds on a configuration file: it is read whole before the daemon
// starts, so keep it small.
const (
	maxConfigBytes = 1 << 20
	maxConfigLine  = 64 << 10
)

// notSettings are flags that the file cannot set: the file's own name and
// cobra's flags that print and exit.
var notSettings = map[string]bool{"config": true, "help": true, "version": true}

// isSetting reports whether a flag is a setting of the file: visible
// flags only, so that test and debug switches stay on the command line.
func isSetting(f *pflag.Flag) bool { return f != nil && !f.Hidden && !notSettings[f.Name] }

// settingsOf is the effective value of every setting: from the command
// line, the configuration file or the default.
func settingsOf(flags *pflag.FlagSet) map[string]string {
	out := map[string]string{}
	flags.VisitAll(func(f *pflag.Flag) {
		if isSetting(f) {
			out[f.Name] = f.Value.String()
		}
	})
	return out
}

// applyConfigFile reads the file at path and sets every flag it names that
// was not given on the command line.
func applyConfigFile(flags *pflag.FlagSet, path string) error {
	fh, err := os.Open(path) //nolint:gosec // the operator names the file
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer func() { _ = fh.Close() }() // read only
	b, err := io.ReadAll(io.LimitReader(fh, maxConfigBytes+1))
	if err != nil {
		return fmt.Errorf("config: %s: %w", path, err)
	}
	if len(b) > maxConfigBytes {
		return fmt.Errorf("config: %s: larger than %d bytes", path, maxConfigBytes)
	}
	return applyConfig(flags, path, b)
}

// applyConfig applies the text of a configuration file (name is its path,
// for errors).
func applyConfig(flags *pflag.FlagSet, name string, text []byte) error {
	fromCommandLine := map[string]bool{}
	flags.Visit(func(f *pflag.Flag) { fromCommandLine[f.Name] = true })
	seen := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 0, 4096), maxConfigLine)
	for n := 1; sc.Scan(); n++ {
		fail := func(format string, args ...any) error {
			return fmt.Errorf("%s:%d: %s", name, n, fmt.Sprintf(format, args...))
		}
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return fail("expected name = value, got %q", clip(line))
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		f := flags.Lookup(key)
		if !isSetting(f) {
			return fail("unknown setting %q", clip(key))
		}
		if first, dup := seen[key]; dup {
			return fail("%s is set twice (first on line %d)", key, first)
		}
		seen[key] = n
		if strings.HasPrefix(value, `"`) {
			v, err := strconv.Unquote(value)
			if err != nil {
				return fail("%s: bad quoted value %s", key, clip(value))
			}
			value = v
		}
		if fromCommandLine[key] {
			continue // the command line wins
		}
		if err := flags.Set(key, value); err != nil {
			return fail("%s: %v", key, err)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("%s: a line is longer than %d bytes", name, maxConfigLine)
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// clip shortens hostile text quoted in an error.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// packagedSettings are the Debian package's choices, written uncommented
// in the toolstackd.conf it ships: a host service runs QEMU, keeps its
// state in /var/lib, its runtime files in /run and the administrator's
// scripts in /etc.
var packagedSettings = []struct{ name, value string }{
	{"backend", "qemu"},
	// As xapi: HTTPS on 443 (certificate made at first start), plain HTTP
	// on 80.
	{"listen", "0.0.0.0:80"},
	{"listen-https", "0.0.0.0:443"},
	{"data-dir", "/var/lib/toolstackd"},
	{"run-dir", "/run/toolstackd"},
	{"hooks-dir", "/etc/toolstackd/hooks"},
	{"storage-plugin-dirs", "/etc/toolstackd/storage-plugins,/usr/libexec/toolstackd/storage"},
	// Networks made real with Linux bridges.
	{"network-backend", "linux"},
}

// docDefault is the annotation that replaces a flag's default in the
// documentation when the real one depends on who runs the daemon.
const docDefault = "toolstackd-doc-default"

// defaultText is a flag's default as documented.
func defaultText(f *pflag.Flag) string {
	if d, ok := f.Annotations[docDefault]; ok && len(d) == 1 {
		return d[0]
	}
	return f.DefValue
}

// configTemplate is the toolstackd.conf the package ships: a header on
// the format, then every setting in name order with its help, commented
// out at its default unless the package sets it.
func configTemplate(flags *pflag.FlagSet) string {
	packaged := map[string]string{}
	for _, s := range packagedSettings {
		packaged[s.name] = s.value
	}
	var b strings.Builder
	b.WriteString(`# toolstackd's configuration: read by the toolstackd service
# (toolstackd --config /etc/toolstackd/toolstackd.conf).
#
# One setting per line, "name = value"; every setting is the daemon's
# command-line flag of the same name (see toolstackd(8)), and a flag given
# on the command line wins over this file. Lines starting with '#' are
# comments; a value may be written in double quotes to keep spaces at
# either end. An unknown name, or a name set twice, stops the daemon with
# this file's name and the line.
#
# Settings left commented out below are at their default. Durations are
# written as 30s, 5m, 1h30m.
#
# This file was generated by "toolstackd config-template".
`)
	flags.VisitAll(func(f *pflag.Flag) {
		if !isSetting(f) {
			return
		}
		b.WriteString("\n")
		b.WriteString(wrapComment(f.Name+": "+f.Usage, 76))
		if v, ok := packaged[f.Name]; ok {
			b.WriteString(wrapComment("(the package's choice; default: "+orNone(defaultText(f))+")", 76))
			fmt.Fprintf(&b, "%s = %s\n", f.Name, quoteIfNeeded(v))
			return
		}
		fmt.Fprintf(&b, "#%s = %s\n", f.Name, quoteIfNeeded(defaultText(f)))
	})
	return strings.ReplaceAll(b.String(), " \n", "\n")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// quoteIfNeeded quotes a value that would not read back as itself.
func quoteIfNeeded(v string) string {
	if v != strings.TrimSpace(v) || strings.HasPrefix(v, `"`) {
		return strconv.Quote(v)
	}
	return v
}

// wrapComment wraps text into '#' comment lines of at most width
// characters.
func wrapComment(text string, width int) string {
	var b strings.Builder
	line := "#"
	for _, w := range strings.Fields(text) {
		if len(line) > 1 && len(line)+1+len(w) > width {
			b.WriteString(line + "\n")
			line = "#"
		}
		line += " " + w
	}
	b.WriteString(line + "\n")
	return b.String()
}

// configTemplateCmd prints the configuration file the package ships.
func configTemplateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "config-template",
		Short: "Print a configuration file with every setting documented, commented out at its default",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := io.WriteString(cmd.OutOrStdout(), configTemplate(cmd.Root().Flags()))
			return err
		},
	}
}

// storagePluginDirs is --storage-plugin-dirs as a list (nil: the storage
// layer's default).
func (o options) storagePluginDirs() []string {
	var dirs []string
	for _, d := range strings.Split(o.pluginDirs, ",") {
		if d = strings.TrimSpace(d); d != "" {
			dirs = append(dirs, d)
		}
	}
	return dirs
}
