package peerauth

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

const (
	poolSecret  = "the-pool-secret-0123456789"
	otherSecret = "another-pool-secret-98765"
)

var now = time.Unix(1_800_000_000, 0)

func req() Request {
	return Request{Method: "POST", Host: "127.0.0.2:8080", URI: "/pool/call", Bound: []string{`{"user":"root"}`}}
}

func isSelf(host string) bool { return host == "127.0.0.2:8080" }

func TestSignVerifyProve(t *testing.T) {
	h := http.Header{}
	nonce := Sign(h, poolSecret, req(), now)
	if strings.Contains(h.Get(Header), poolSecret) {
		t.Fatal("the signature holds the secret")
	}
	v := NewVerifier()
	secret, got, err := v.Verify(h, []string{otherSecret, poolSecret}, req(), isSelf, now.Add(time.Second))
	if err != nil || secret != poolSecret || got != nonce {
		t.Fatalf("Verify: %q %q %v", secret, got, err)
	}
	answer := http.Header{}
	Prove(answer, secret, nonce, req())
	if !CheckProof(answer, []string{poolSecret}, nonce, req()) {
		t.Fatal("the proof of the right secret is refused")
	}
	if CheckProof(answer, []string{otherSecret}, nonce, req()) {
		t.Fatal("a proof checks under another secret")
	}
	if CheckProof(answer, []string{poolSecret}, "another-nonce", req()) {
		t.Fatal("a proof for another nonce checks")
	}
	if CheckProof(http.Header{}, []string{poolSecret}, nonce, req()) {
		t.Fatal("an answer without a proof checks")
	}
}

func TestVerifyRefuses(t *testing.T) {
	sign := func(secret string, q Request, at time.Time) http.Header {
		h := http.Header{}
		Sign(h, secret, q, at)
		return h
	}
	other := func(f func(*Request)) Request { q := req(); f(&q); return q }
	cases := []struct {
		name string
		h    http.Header
		q    Request
		want error
	}{
		{"unsigned", http.Header{}, req(), ErrMissing},
		{"garbage", http.Header{Header: {"v1 x y z"}}, req(), ErrBadForm},
		{"other secret", sign(otherSecret, req(), now), req(), ErrBadMAC},
		{"another method", sign(poolSecret, req(), now), other(func(q *Request) { q.Method = "GET" }), ErrBadMAC},
		{"another path", sign(poolSecret, req(), now), other(func(q *Request) { q.URI = "/pool/db" }), ErrBadMAC},
		{"another identity", sign(poolSecret, req(), now), other(func(q *Request) { q.Bound = []string{`{"superuser":true}`} }), ErrBadMAC},
		// What a foreign listener was sent, replayed at a member with the
		// Host it was signed for, or with the member's.
		{"signed for another host", sign(poolSecret, other(func(q *Request) { q.Host = "127.0.0.9:8080" }), now),
			other(func(q *Request) { q.Host = "127.0.0.9:8080" }), ErrNotSelf},
		{"host changed", sign(poolSecret, other(func(q *Request) { q.Host = "127.0.0.9:8080" }), now), req(), ErrBadMAC},
		{"old", sign(poolSecret, req(), now.Add(-DefaultSkew-time.Second)), req(), ErrStale},
		{"future", sign(poolSecret, req(), now.Add(DefaultSkew+time.Second)), req(), ErrStale},
	}
	for _, c := range cases {
		_, _, err := NewVerifier().Verify(c.h, []string{poolSecret}, c.q, isSelf, now)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

func TestReplayRefused(t *testing.T) {
	v := NewVerifier()
	h := http.Header{}
	Sign(h, poolSecret, req(), now)
	if _, _, err := v.Verify(h, []string{poolSecret}, req(), isSelf, now); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.Verify(h, []string{poolSecret}, req(), isSelf, now.Add(time.Second)); !errors.Is(err, ErrReplay) {
		t.Fatalf("a replay: %v", err)
	}
}

// A full nonce store forgets its oldest nonces, and from then on refuses
// requests as old as those: nothing is ever accepted twice.
func TestNonceBound(t *testing.T) {
	v := NewVerifierWith(time.Minute, 4)
	var first http.Header
	for i := range 10 {
		h := http.Header{}
		at := now.Add(time.Duration(i) * time.Second)
		Sign(h, poolSecret, req(), at)
		if i == 0 {
			first = h
		}
		if _, _, err := v.Verify(h, []string{poolSecret}, req(), isSelf, at); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if n := len(v.seen); n > 4 {
		t.Fatalf("%d nonces kept, bound 4", n)
	}
	if _, _, err := v.Verify(first, []string{poolSecret}, req(), isSelf, now.Add(10*time.Second)); !errors.Is(err, ErrReplay) {
		t.Fatalf("a forgotten nonce replayed: %v", err)
	}
	// A fresh request still passes.
	h := http.Header{}
	Sign(h, poolSecret, req(), now.Add(11*time.Second))
	if _, _, err := v.Verify(h, []string{poolSecret}, req(), isSelf, now.Add(11*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Nonces out of the window are forgotten without raising the floor.
	late := now.Add(5 * time.Minute)
	h = http.Header{}
	Sign(h, poolSecret, req(), late)
	if _, _, err := v.Verify(h, []string{poolSecret}, req(), isSelf, late); err != nil {
		t.Fatal(err)
	}
	if len(v.seen) != 1 {
		t.Fatalf("%d nonces kept after the window moved on", len(v.seen))
	}
}

func TestSameAddr(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"127.0.0.2:80", "127.0.0.2:80", true},
		{"[::1]:80", "[0:0::1]:80", true},
		{"127.0.0.2:80", "127.0.0.2:81", false},
		{"127.0.0.2:80", "127.0.0.3:80", false},
		{"host:80", "127.0.0.2:80", false},
		{"junk", "junk2", false},
	} {
		if got := SameAddr(c.a, c.b); got != c.want {
			t.Errorf("SameAddr(%q, %q) = %v", c.a, c.b, got)
		}
	}
}

// The header comes from anyone who can reach the port: Verify refuses
// what is not a signature without failing otherwise, and accepts nothing
// not signed with the secret.
func FuzzVerify(f *testing.F) {
	h := http.Header{}
	Sign(h, poolSecret, req(), now)
	f.Add(h.Get(Header))
	f.Add("v1 1800000000 AAAAAAAAAAAAAAAAAAAAAA AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		h := http.Header{Header: {s}}
		_, _, err := NewVerifier().Verify(h, []string{otherSecret}, req(), isSelf, now)
		if err == nil {
			t.Fatalf("%q accepted under a secret that did not sign it", s)
		}
	})
}

// BenchmarkSignVerifyProve is the authentication's cost per intra-pool
// request: the sender's signature, the receiver's check (with its nonce
// store) and proof, and the sender's check of the proof.
func BenchmarkSignVerifyProve(b *testing.B) {
	v := NewVerifier()
	secrets := []string{poolSecret}
	q := req()
	for i := 0; b.Loop(); i++ {
		h := http.Header{}
		at := now.Add(time.Duration(i) * time.Millisecond)
		nonce := Sign(h, poolSecret, q, at)
		secret, n, err := v.Verify(h, secrets, q, isSelf, at)
		if err != nil {
			b.Fatal(err)
		}
		answer := http.Header{}
		Prove(answer, secret, n, q)
		if !CheckProof(answer, secrets, nonce, q) {
			b.Fatal("proof")
		}
	}
}

func TestSealOpen(t *testing.T) {
	sealed, err := Seal(poolSecret, "rotation", "the-next-secret")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sealed, "the-next-secret") || strings.Contains(sealed, poolSecret) {
		t.Fatal("the sealed value shows what it holds")
	}
	if got, err := Open([]string{otherSecret, poolSecret}, "rotation", sealed); err != nil || got != "the-next-secret" {
		t.Fatalf("Open: %q %v", got, err)
	}
	for name, c := range map[string]struct {
		secrets         []string
		purpose, sealed string
	}{
		"another secret":  {[]string{otherSecret}, "rotation", sealed},
		"another purpose": {[]string{poolSecret}, "something else", sealed},
		"tampered":        {[]string{poolSecret}, "rotation", sealed[:len(sealed)-2] + "AA"},
		"empty":           {[]string{poolSecret}, "rotation", ""},
		"plain text":      {[]string{poolSecret}, "rotation", "the-next-secret"},
	} {
		if _, err := Open(c.secrets, c.purpose, c.sealed); !errors.Is(err, ErrSealed) {
			t.Errorf("%s: %v, want ErrSealed", name, err)
		}
	}
}
