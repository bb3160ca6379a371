package api

import (
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/schema"
)

// Every entry of serverOwnedAtCreation names a read-only field the
// datamodel has: a renamed or removed field would otherwise silently stop
// being protected.
func TestServerOwnedAtCreationNamesConstructorFields(t *testing.T) {
	for class, fields := range serverOwnedAtCreation {
		c := dm.Model.Class(class)
		if c == nil {
			t.Errorf("serverOwnedAtCreation: no class %s", class)
			continue
		}
		for name := range fields {
			f := c.Field(name)
			switch {
			case f == nil:
				t.Errorf("serverOwnedAtCreation: no field %s.%s", class, name)
			case f.Qualifier == schema.RW:
				t.Errorf("serverOwnedAtCreation: %s.%s is RW", class, name)
			case !serverOwnedAtCreate(f):
				t.Errorf("%s.%s not reported server-owned", class, name)
			}
		}
	}
}
