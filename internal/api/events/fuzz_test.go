package events_test

import (
	"strings"
	"testing"

	"toolstackd/internal/api/events"
	"toolstackd/internal/xerr"
)

func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"", "0,0", "5,0", "00000000000000000042,00000000000000000000", "-1,0", "+3,0x1f",
		"0x7FFFFFFFFFFFFFFF,0", "0xFFFFFFFFFFFFFFFF,0", "1_000,0", "9223372036854775808,0", "abc", "1,2,3", ",", "0u9,0b1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		g, err := events.ParseToken(tok)
		if err != nil {
			xe, ok := err.(*xerr.Error)
			if !ok || xe.Code != xerr.EventFromTokenParseFailure || len(xe.Params) != 1 || xe.Params[0] != tok {
				t.Fatalf("ParseToken(%q) error %v", tok, err)
			}
			return
		}
		if tok != "" && strings.Count(tok, ",") != 1 {
			t.Fatalf("ParseToken(%q) accepted %d commas", tok, strings.Count(tok, ","))
		}
		if g > 1<<63-1 {
			t.Fatalf("ParseToken(%q) = %d, beyond int64", tok, g)
		}
		out := events.FormatToken(g)
		if len(out) != 41 {
			t.Fatalf("FormatToken(%d) = %q", g, out)
		}
		if g2, err := events.ParseToken(out); err != nil || g2 != g {
			t.Fatalf("round trip of %q: %q -> %d, %v", tok, out, g2, err)
		}
	})
}
