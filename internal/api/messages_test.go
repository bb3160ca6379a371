package api_test

import (
	"encoding/json"
	"testing"
	"time"

	"toolstackd/internal/xerr"
)

// message.destroy_all reads its filters as xapi does: before and after
// are times, priority a number; other keys are ignored.
func TestMessageDestroyAllFilters(t *testing.T) {
	h := newHarness(t)
	s := h.login("root", rootPW)
	count := func() int {
		t.Helper()
		var all []string
		raw, _ := json.Marshal(h.ok("message.get_all", s))
		if err := json.Unmarshal(raw, &all); err != nil {
			t.Fatal(err)
		}
		return len(all)
	}
	h.ok("message.create", s, "M", int64(1), "VM", "uuid", "first")
	h.fails(xerr.InvalidValue, "message.destroy_all", s, map[string]any{"before": "yesterday"})
	h.fails(xerr.InvalidValue, "message.destroy_all", s, map[string]any{"priority": "high"})
	h.ok("message.destroy_all", s, map[string]any{"name": "nothing-matches-a-name"}) // ignored: every message
	if n := count(); n != 0 {
		t.Fatalf("an unknown filter key kept %d messages; xapi ignores the key", n)
	}
	for i, prio := range []int64{1, 2, 2} {
		h.ok("message.create", s, "M", prio, "VM", "uuid", string(rune('a'+i)))
	}
	mid := time.Now().UTC()
	time.Sleep(10 * time.Millisecond)
	h.ok("message.create", s, "LATE", int64(5), "VM", "uuid", "late")
	h.ok("message.destroy_all", s, map[string]any{"priority": "2"})
	if n := count(); n != 2 {
		t.Fatalf("after destroying priority 2: %d messages, want 2", n)
	}
	h.ok("message.destroy_all", s, map[string]any{"before": mid.Format(time.RFC3339Nano)})
	if n := count(); n != 1 {
		t.Fatalf("after destroying those before the middle: %d messages, want 1", n)
	}
	h.ok("message.destroy_all", s, map[string]any{"after": mid.Format(time.RFC3339Nano)})
	if n := count(); n != 0 {
		t.Fatalf("after destroying those after the middle: %d messages, want 0", n)
	}
}
