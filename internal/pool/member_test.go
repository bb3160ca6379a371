package pool

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
)

// readMember answers what is not a member message 400, a host that is not
// in the pool 404, and hands over the member of a host that is.
func TestReadMember(t *testing.T) {
	d, self := bootedDB(t)
	host, _ := d.Snapshot().Get(dm.Host.Class, self)
	p := &Pool{cfg: Config{Server: &api.Server{DB: d}}}
	for _, c := range []struct {
		body string
		code int
	}{
		{"\x00not json", http.StatusBadRequest},
		{`{"uuid":`, http.StatusBadRequest},
		{`{"uuid":"00000000-0000-0000-0000-000000000000","address":"10.0.0.1:443"}`, http.StatusNotFound},
		{`{"uuid":"` + host.UUID() + `","address":"10.0.0.1:443"}`, 0},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, readdPath, strings.NewReader(c.body))
		m, ok := p.readMember(w, r)
		switch {
		case c.code == 0 && (!ok || m.UUID != host.UUID() || m.Address != "10.0.0.1:443" || w.Code != http.StatusOK):
			t.Errorf("%q: member %+v, ok %v, answered %d", c.body, m, ok, w.Code)
		case c.code != 0 && (ok || w.Code != c.code):
			t.Errorf("%q: ok %v, answered %d, want %d", c.body, ok, w.Code, c.code)
		}
	}
}
