package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/pool/dbraft"
	"toolstackd/internal/pool/raftnet"
	"toolstackd/internal/pool/secret"
	"toolstackd/internal/xerr"
)

// secretPath takes one step of a pool secret rotation.
const secretPath = "/pool/secret"

// Rotation steps, each done on every host before the next starts (see
// package secret).
const (
	stepAccept = "accept"
	stepRotate = "rotate"
	stepRetire = "retire"
)

type secretStep struct {
	Step   string `json:"step"`
	Secret string `json:"secret,omitempty"`
}

// rotateSecret is pool.rotate_secret, on the coordinator: a new secret,
// accepted everywhere, then presented everywhere, then the old one
// retired everywhere, so that no two hosts ever refuse each other. A host
// that cannot be reached fails the rotation (CANNOT_CONTACT_HOST); the
// hosts done so far accept both secrets until the next rotation.
func (p *Pool) rotateSecret(c *api.Call, _ dm.PoolRotateSecretArgs) (dm.Void, error) {
	rf := p.cfg.Repl.Raft()
	if rf == nil {
		next, err := secret.New()
		if err != nil {
			return dm.Void{}, err
		}
		return dm.Void{}, p.secrets.Set(next) // a host alone
	}
	if p.cfg.Repl.Mode() != dbraft.Leader {
		return dm.Void{}, xerr.New(xerr.HostIsSlave, p.Coordinator())
	}
	f := rf.GetConfiguration()
	if err := f.Error(); err != nil {
		return dm.Void{}, err
	}
	var peers []string
	for _, s := range f.Configuration().Servers {
		if string(s.ID) != p.cfg.HostUUID {
			peers = append(peers, string(s.Address))
		}
	}
	next, err := secret.New()
	if err != nil {
		return dm.Void{}, err
	}
	for _, step := range []string{stepAccept, stepRotate, stepRetire} {
		for _, addr := range peers {
			if err := p.sendStep(c.Ctx, addr, secretStep{Step: step, Secret: next}); err != nil {
				p.log.Warn("pool.rotate_secret: a host did not take a step", "host", addr, "step", step, "err", err)
				return dm.Void{}, xerr.New(xerr.CannotContactHost, addr)
			}
		}
		if err := p.takeStep(secretStep{Step: step, Secret: next}); err != nil {
			return dm.Void{}, err
		}
	}
	p.log.Info("the pool secret was rotated")
	return dm.Void{}, nil
}

func (p *Pool) sendStep(ctx context.Context, addr string, st secretStep) error {
	body, err := json.Marshal(st) //nolint:gosec // the pool secret goes to a member, under the current one
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := p.post(ctx, addr, secretPath, "application/json", body)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s: %s", resp.Status, msg)
	}
	return nil
}

// takeStep applies one step of a rotation to this host's secret.
func (p *Pool) takeStep(st secretStep) error {
	switch st.Step {
	case stepAccept:
		return p.secrets.Accept(st.Secret)
	case stepRotate:
		return p.secrets.Rotate(st.Secret)
	case stepRetire:
		if p.secrets.Current() != st.Secret {
			return fmt.Errorf("retiring the old secret of a rotation this host did not take")
		}
		return p.secrets.Retire()
	}
	return fmt.Errorf("unknown rotation step %q", st.Step)
}

// serveSecret takes a step of a rotation the coordinator runs.
func (p *Pool) serveSecret(w http.ResponseWriter, r *http.Request) {
	if !p.secrets.Check(r.Header.Get(raftnet.SecretHeader)) {
		http.Error(w, "pool secret required", http.StatusForbidden)
		return
	}
	var st secretStep
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&st); err != nil {
		http.Error(w, "a rotation step is JSON", http.StatusBadRequest)
		return
	}
	if err := p.takeStep(st); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusOK)
}
