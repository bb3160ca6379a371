package xenops

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
)

// After a failed cross-pool move the source asks the other pool to drop
// what the move made there, and nothing else: a VM of the same uuid the
// other pool had already (why it refused the move) stays, with its
// snapshots; the VM the move made, marked with its source token, goes.
func TestCleanRemoteDestroysOnlyWhatTheMoveMade(t *testing.T) {
	for _, c := range []struct {
		name string
		ops  map[string]string
		want []string
	}{
		{"the other pool's own VM", map[string]string{}, nil},
		{"another move's VM", map[string]string{migrateInKey("ffffffffffffffff0000"): "migrate_send"}, nil},
		{"this move's VM", map[string]string{migrateInKey("0123456789abcdef0000"): "migrate_send"},
			[]string{"OpaqueRef:snap", "OpaqueRef:vm"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			var destroyed []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var req struct {
					Method string `json:"method"`
					Params []any  `json:"params"`
				}
				_ = json.NewDecoder(r.Body).Decode(&req)
				result := map[string]any{
					"VM.get_current_operations": c.ops, "VM.get_power_state": "Halted", "VM.get_uuid": "vm-uuid",
					"VM.get_snapshot_of": "OpaqueRef:vm", "VM.destroy": "",
				}[req.Method]
				switch req.Method {
				case "VM.get_by_uuid":
					result = map[any]string{"vm-uuid": "OpaqueRef:vm", "snap-uuid": "OpaqueRef:snap"}[req.Params[1]]
				case "VM.destroy":
					mu.Lock()
					destroyed = append(destroyed, req.Params[1].(string))
					mu.Unlock()
				}
				_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": 1, "result": result})
			}))
			defer srv.Close()
			rp, err := newRemotePool(map[string]string{"session_id": "OpaqueRef:s", "host": "OpaqueRef:h", "master": srv.URL + "/"}, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			m := &Manager{log: slog.New(slog.DiscardHandler)}
			m.cleanRemote(context.Background(), rp, "vm-uuid", "0123456789abcdef0000", []string{"snap-uuid"})
			slices.Sort(destroyed)
			if !slices.Equal(destroyed, c.want) {
				t.Fatalf("destroyed %v, want %v", destroyed, c.want)
			}
		})
	}
}
