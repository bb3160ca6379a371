package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"toolstackd/internal/journal"
)

func TestLogTargetFlag(t *testing.T) {
	cmd := rootCmd()
	f := cmd.Flags().Lookup("log-target")
	if f == nil || f.DefValue != "auto" {
		t.Fatalf("--log-target: %+v", f)
	}
	for _, ok := range []string{"auto", "journal", "stderr", "json"} {
		if err := f.Value.Set(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	if err := f.Value.Set("syslog"); err == nil {
		t.Error("syslog accepted")
	}
}

func TestLogHandlerChoice(t *testing.T) {
	file, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	mine := fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	other := fmt.Sprintf("%d:%d", st.Dev, st.Ino+1)
	for _, c := range []struct {
		target logTarget
		stream string
		want   string
	}{
		{"auto", mine, "journal"},
		{"", mine, "journal"},
		{"auto", other, "text"}, // stderr redirected since systemd set it up
		{"auto", "", "text"},
		{"auto", "garbage", "text"},
		{"journal", "", "journal"},
		{"stderr", mine, "text"},
		{"json", mine, "json"},
	} {
		h := logHandler(c.target, slog.LevelInfo, file, c.stream)
		var got string
		switch h := h.(type) {
		case *journal.Handler:
			got = "journal"
			_ = h.Close()
		case *slog.TextHandler:
			got = "text"
		case *slog.JSONHandler:
			got = "json"
		}
		if got != c.want {
			t.Errorf("target %q, JOURNAL_STREAM %q: %s handler, want %s", c.target, c.stream, got, c.want)
		}
	}
}
