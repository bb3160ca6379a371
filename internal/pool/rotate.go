package pool

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/pool/dbraft"
	"toolstackd/internal/pool/peerauth"
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

// secretStep is one step of a rotation as the coordinator sends it: the
// new secret sealed under the secret hosts hold now (peerauth.Seal), so
// that the request carries nothing a listener without the pool's secret
// can read.
type secretStep struct {
	Step   string `json:"step"`
	Secret string `json:"secret,omitempty"`
}

// sealPurpose binds a sealed secret to rotations.
const sealPurpose = "pool secret rotation"

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
		sealed, err := peerauth.Seal(p.secrets.Current(), sealPurpose, next)
		if err != nil {
			return dm.Void{}, err
		}
		for _, addr := range peers {
			ctx, cancel := context.WithTimeout(c.Ctx, 30*time.Second)
			err := p.notify(ctx, addr, secretPath, secretStep{Step: step, Secret: sealed})
			cancel()
			if err != nil {
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
	var st secretStep
	if !readJSON(w, r, &st) {
		return
	}
	next, err := peerauth.Open(p.secrets.Valid(), sealPurpose, st.Secret)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	st.Secret = next
	answer(w, p.takeStep(st), http.StatusBadRequest)
}
