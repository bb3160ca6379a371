// Package secret keeps a host's pool secret: the shared key members of a
// pool present to each other on every intra-pool connection (raft
// traffic, forwarded calls), as xapi's pool token (ptoken) is.
//
// A host makes its secret on first start; a host joining a pool takes the
// pool's (Set) and gives up its own. pool.rotate_secret replaces it in
// three steps, each done on every host before the next starts, so that no
// two hosts ever refuse each other: Accept (the new secret is valid too,
// the old one still presented), Rotate (the new one presented, the old
// one still valid), Retire (only the new one). Check accepts any valid
// secret and compares in constant time.
//
// The secret lives in one file, pool-secret, in the host's state
// directory, readable by its owner only; it is replaced atomically (a new
// file renamed over the old, the directory synced), so a crash leaves
// either the old secret or the new.
package secret

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"toolstackd/internal/atomicfile"
	"toolstackd/internal/safepath"
)

// FileName is the secret file's name in the state directory.
const FileName = "pool-secret"

// secretBytes is the entropy of a made secret.
const secretBytes = 32

// maxLen bounds a secret given from outside (Set) and the file read back.
const maxLen = 256

// ErrInvalid is returned for a secret that is empty, too long or not
// printable.
var ErrInvalid = errors.New("secret: invalid pool secret")

// Store is a host's pool secret.
type Store struct {
	path string

	mu       sync.RWMutex
	current  string
	previous string // still valid during a rotation, or ""
}

// Open reads the secret in dir, making one if there is none.
func Open(dir string) (*Store, error) {
	path, err := safepath.JoinName(dir, FileName)
	if err != nil {
		return nil, err
	}
	s := &Store{path: path}
	b, err := os.ReadFile(path) //nolint:gosec // path is dir + a constant name
	switch {
	case errors.Is(err, os.ErrNotExist):
		cur, err := New()
		if err != nil {
			return nil, err
		}
		s.current = cur
		return s, s.save()
	case err != nil:
		return nil, err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 2 || !valid(lines[0]) || (len(lines) == 2 && !valid(lines[1])) {
		return nil, fmt.Errorf("%s: %w", path, ErrInvalid)
	}
	s.current = lines[0]
	if len(lines) == 2 {
		s.previous = lines[1]
	}
	return s, nil
}

// New makes a fresh random secret.
func New() (string, error) {
	b := make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func valid(s string) bool {
	if s == "" || len(s) > maxLen {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r > '~' {
			return false
		}
	}
	return true
}

// Current is the secret this host presents.
func (s *Store) Current() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.current
}

// Valid lists the secrets this host accepts: the current one, and the
// previous one while a rotation is under way.
func (s *Store) Valid() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.previous != "" {
		return []string{s.current, s.previous}
	}
	return []string{s.current}
}

// Check reports whether given is a valid secret, in time independent of
// how much of it matches.
func (s *Store) Check(given string) bool {
	ok := 0
	for _, v := range s.Valid() {
		ok |= subtle.ConstantTimeCompare([]byte(given), []byte(v))
	}
	return ok == 1 && given != ""
}

// Set makes secret this host's only secret (joining a pool, or a member
// told of a finished rotation).
func (s *Store) Set(secret string) error {
	if !valid(secret) {
		return ErrInvalid
	}
	return s.swap(func() (string, string) { return secret, "" })
}

// Accept makes next valid as well, while the current secret is still the
// one presented: the first step of a rotation across a pool, so that no
// member refuses another that has already moved on.
func (s *Store) Accept(next string) error {
	if !valid(next) {
		return ErrInvalid
	}
	return s.swap(func() (string, string) { return s.current, next })
}

// Rotate makes next current and keeps the old secret valid until Retire.
func (s *Store) Rotate(next string) error {
	if !valid(next) {
		return ErrInvalid
	}
	return s.swap(func() (string, string) { return next, s.current })
}

// Retire ends a rotation: only the current secret stays valid.
func (s *Store) Retire() error {
	return s.swap(func() (string, string) { return s.current, "" })
}

// swap replaces the secrets with what next returns and saves them; if
// the file cannot be written, the old ones stay.
func (s *Store) swap(next func() (current, previous string)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, oldPrev := s.current, s.previous
	s.current, s.previous = next()
	if s.current == old && s.previous == oldPrev {
		return nil
	}
	if err := s.save(); err != nil {
		s.current, s.previous = old, oldPrev
		return err
	}
	return nil
}

// save writes the file atomically. Called with s.mu held for writing (or
// before s is shared).
func (s *Store) save() error {
	body := s.current + "\n"
	if s.previous != "" {
		body += s.previous + "\n"
	}
	return atomicfile.WriteFile(s.path, []byte(body), 0o600)
}
