package main

import (
	"os"
	"strings"
	"testing"
)

// The toolstackd.conf the package ships is the one config-template makes
// from the flags: a new flag must reach the file (make deb checks it too).
func TestShippedConfigIsTheTemplate(t *testing.T) {
	want := configTemplate(rootCmd().Flags())
	got, err := os.ReadFile("../../packaging/toolstackd.conf")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatal("packaging/toolstackd.conf is not what `toolstackd config-template` prints: regenerate it with\n" +
			"  go run ./cmd/toolstackd config-template > packaging/toolstackd.conf")
	}
	// Read back, the shipped file sets the package's choices and nothing
	// else.
	cmd := rootCmd()
	if err := applyConfig(cmd.Flags(), "toolstackd.conf", got); err != nil {
		t.Fatal(err)
	}
	for _, s := range packagedSettings {
		if v := cmd.Flags().Lookup(s.name).Value.String(); v != s.value {
			t.Errorf("%s = %q, want %q", s.name, v, s.value)
		}
	}
}

func TestConfigFile(t *testing.T) {
	cmd := rootCmd()
	f := cmd.Flags()
	if err := f.Parse([]string{"--listen", "127.0.0.9:80"}); err != nil {
		t.Fatal(err)
	}
	text := "# a comment\n\n  listen = 10.0.0.1:8080\nbackend=qemu\nwitness = true\nhost-memory = 2GiB\n" +
		"idle-timeout = 90s\nadvertise = \" 1.2.3.4:443 \"\nha-timing =\n"
	if err := applyConfig(f, "t.conf", []byte(text)); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"listen":       "127.0.0.9:80", // the command line wins
		"backend":      "qemu",
		"witness":      "true",
		"idle-timeout": "1m30s",
		"advertise":    " 1.2.3.4:443 ",
		"ha-timing":    "",
	} {
		if got := f.Lookup(name).Value.String(); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if got := f.Lookup("host-memory").Value.String(); !strings.Contains(got, "2") {
		t.Errorf("host-memory = %q", got)
	}
}

func TestConfigFileErrors(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"listen = a\nbogus = 1\n", "t.conf:2: unknown setting \"bogus\""},
		{"\n\nlisten\n", "t.conf:3: expected name = value"},
		{"listen = a\nlisten = b\n", "t.conf:2: listen is set twice (first on line 1)"},
		{"witness = maybe\n", "t.conf:1: witness:"},
		{"idle-timeout = soon\n", "t.conf:1: idle-timeout:"},
		{"advertise = \"open\n", "t.conf:1: advertise: bad quoted value"},
		{"config = /etc/other\n", "t.conf:1: unknown setting \"config\""},
		{"debug-hooks = true\n", "t.conf:1: unknown setting \"debug-hooks\""}, // hidden: the command line's only
		{"help = true\n", "t.conf:1: unknown setting \"help\""},
		{"listen = " + strings.Repeat("x", maxConfigLine) + "\n", "longer than"},
	} {
		err := applyConfig(rootCmd().Flags(), "t.conf", []byte(c.text))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.40q: error %v, want %q", c.text, err, c.want)
		}
	}
	big := make([]byte, maxConfigBytes+1)
	path := t.TempDir() + "/big.conf"
	if err := os.WriteFile(path, big, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := applyConfigFile(rootCmd().Flags(), path); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a huge file: %v", err)
	}
}
