package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/pool"
	"toolstackd/internal/pool/replica"
	"toolstackd/internal/testkit/poolfarm"
	"toolstackd/internal/testkit/pooltest"
)

// BareJoin is the join request of a program that is no toolstackd host
// (issue 29, finding 4): the rows a fresh host's first boot makes, under
// a uuid of their own, naming address as the joiner's, with this
// toolstackd's versions. Nothing need answer at address.
func BareJoin(t *testing.T, name, address string) pool.JoinRequest {
	t.Helper()
	facts := api.HostFacts{Hostname: name, Address: "127.0.0.1", Device: "eth0", MAC: "02:00:00:00:00:01",
		CPUs: 1, CPUModel: "bare joiner", CPUVendor: "none", MemTotal: 1 << 30, MemFree: 1 << 30}
	rows, uuid, _, err := poolfarm.HostRows(facts, map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	apiVer, dbSchema := pool.APIVersion(), pool.SchemaVersion(dm.Model)
	return pool.JoinRequest{UUID: uuid, Address: address, Rows: replica.EncodeRows(rows), APIVersion: apiVer, DBSchema: dbSchema}
}

// PostJoin sends req to host at's POST /pool/join with root's
// credentials, as a joining host would, and returns the XenAPI error the
// host answered (code, then parameters), or nil when it admitted the
// joiner. The call is bounded by a minute (a join takes a second or so).
func PostJoin(t *testing.T, ctx context.Context, p *pooltest.Pool, at int, req pool.JoinRequest) []string {
	t.Helper()
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.Addr(at)+pool.JoinPath, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.SetBasicAuth("root", p.Password())
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep pool.JoinReply
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatalf("the join's answer: %s %v", resp.Status, err)
	}
	if len(rep.Error) == 0 && rep.Secret == "" {
		t.Fatalf("the join's answer has neither an error nor the pool secret: %s %+v", resp.Status, rep)
	}
	return rep.Error
}
