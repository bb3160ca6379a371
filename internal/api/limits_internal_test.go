package api

import (
	"fmt"
	"testing"

	dm "toolstackd/internal/datamodel"
)

// BenchmarkCheckArgs measures the argument-limit walk alone, and the role
// check, for network.set_other_config with a 32-entry map.
func BenchmarkCheckArgs(b *testing.B) {
	s := &Server{Cfg: Config{Limits: DefaultLimits()}}
	m := dm.Model.Message("network.set_other_config")
	oc := map[string]string{}
	for i := range 32 {
		oc[fmt.Sprintf("key-%d", i)] = fmt.Sprintf("a value of moderate length, number %d", i)
	}
	args := []any{"OpaqueRef:x", oc}
	b.Run("limits", func(b *testing.B) {
		for b.Loop() {
			if err := s.checkArgs(m, 1, args); err != nil {
				b.Fatal(err)
			}
		}
	})
	sess := &Session{Roles: AllRoles &^ 1}
	b.Run("roles", func(b *testing.B) {
		for b.Loop() {
			if err := checkCall(sess, m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
