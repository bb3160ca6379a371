// Package peerauth lets the hosts of a pool prove to each other that
// they hold the pool secret without ever sending it.
//
// # The exchange
//
// A host that sends a request to another host of its pool signs it: the
// request carries
//
//	X-Toolstackd-Pool-Auth: v1 <unix seconds> <nonce> <mac>
//
// where the nonce is 16 fresh random bytes and the mac is HMAC-SHA256,
// keyed by the pool secret, over the method, the Host the request is
// addressed to, the request URI, the time, the nonce, and the values of
// the headers that say on whose behalf the request runs (Bound). The
// receiver accepts the request when
//
//   - the mac is right for one of the secrets it holds (two during a
//     rotation),
//   - the Host names the receiver itself (its advertised address, or the
//     address the connection arrived at): a request signed for another
//     address is refused, so what a foreign listener is sent cannot be
//     replayed at a member,
//   - the time is within Skew of the receiver's clock, and
//   - the nonce has not been seen in that window (Verifier keeps them,
//     a bounded number).
//
// The receiver answers with
//
//	X-Toolstackd-Pool-Proof: <mac>
//
// an HMAC keyed by the same secret over the nonce and the Host, which
// the sender checks before it believes the answer (or, for an upgraded
// connection such as raft's, before it sends anything on it). A listener
// that does not hold the secret thus learns neither the secret nor a
// request it could use elsewhere, and cannot pass itself off as a host of
// the pool.
//
// The mac covers the request line and the identity it runs as, not the
// body: the body's integrity on the wire is TLS's business, which a pool
// of hosts serving HTTPS has with each peer's certificate pinned.
package peerauth

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Header names.
const (
	// Header carries a request's signature.
	Header = "X-Toolstackd-Pool-Auth"
	// ProofHeader carries the receiver's proof on its answer.
	ProofHeader = "X-Toolstackd-Pool-Proof"
)

// DefaultSkew is how far a request's time may be from the receiver's
// clock: the hosts of a pool must agree on the time within it.
const DefaultSkew = 5 * time.Minute

// DefaultMaxNonces bounds the nonces a Verifier remembers. Beyond it the
// oldest are forgotten, and requests no newer than the newest forgotten
// one are refused, so that nothing is accepted twice.
const DefaultMaxNonces = 1 << 18

const (
	version    = "v1"
	nonceBytes = 16
	macBytes   = sha256.Size
)

// Errors of Verify.
var (
	ErrMissing = errors.New("peerauth: the request is not signed")
	ErrBadForm = errors.New("peerauth: the signature is malformed")
	ErrBadMAC  = errors.New("peerauth: the signature is not the pool's")
	ErrNotSelf = errors.New("peerauth: the request was signed for another host")
	ErrStale   = errors.New("peerauth: the request's time is too far from this host's clock")
	ErrReplay  = errors.New("peerauth: the request was seen before")
)

// Request is what a signature covers.
type Request struct {
	Method string
	// Host is the address the request is sent to, as in its Host header.
	Host string
	// URI is the request URI (path and query).
	URI string
	// Bound are header values the signature covers besides the request
	// line (on whose behalf it runs), in an order both sides agree on.
	Bound []string
}

// Of is the Request an *http.Request is, with the values of the headers
// named in bound.
func Of(r *http.Request, bound ...string) Request {
	q := Request{Method: r.Method, Host: r.Host, URI: r.URL.RequestURI()}
	if q.Host == "" && r.URL != nil {
		q.Host = r.URL.Host
	}
	for _, h := range bound {
		q.Bound = append(q.Bound, r.Header.Get(h))
	}
	return q
}

func (q Request) message(ts, nonce string) []byte {
	var b strings.Builder
	b.WriteString("toolstackd pool request " + version + "\n")
	for _, s := range []string{q.Method, q.Host, q.URI, ts, nonce} {
		b.WriteString(strconv.Quote(s))
		b.WriteByte('\n')
	}
	for _, s := range q.Bound {
		b.WriteString(strconv.Quote(s))
		b.WriteByte('\n')
	}
	return []byte(b.String())
}

func mac(secret string, msg []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(msg)
	return m.Sum(nil)
}

var enc = base64.RawURLEncoding

// Sign sets h's signature of q with secret at now and returns the nonce,
// which the answer's proof is checked against (CheckProof).
func Sign(h http.Header, secret string, q Request, now time.Time) string {
	var n [nonceBytes]byte
	_, _ = rand.Read(n[:]) // crypto/rand.Read does not fail (Go 1.24+)
	nonce := enc.EncodeToString(n[:])
	ts := strconv.FormatInt(now.Unix(), 10)
	h.Set(Header, version+" "+ts+" "+nonce+" "+enc.EncodeToString(mac(secret, q.message(ts, nonce))))
	return nonce
}

// Verifier checks signatures and remembers their nonces. Its zero value
// is not ready: use NewVerifier.
type Verifier struct {
	skew time.Duration
	max  int

	mu    sync.Mutex
	seen  map[string]int64 // nonce -> its request's time
	order []string         // nonces in the order seen, oldest first from head
	head  int
	floor int64 // requests at or before this time are refused: their nonces may be forgotten
}

// NewVerifier returns a Verifier with the default skew and bound.
func NewVerifier() *Verifier { return NewVerifierWith(DefaultSkew, DefaultMaxNonces) }

// NewVerifierWith returns a Verifier allowing skew either way and
// remembering up to maxNonces nonces.
func NewVerifierWith(skew time.Duration, maxNonces int) *Verifier {
	if maxNonces < 1 {
		maxNonces = 1
	}
	return &Verifier{skew: skew, max: maxNonces, seen: map[string]int64{}}
}

// Verify checks the signature in h for q: self reports whether an
// address (q.Host) names this host. It returns the secret that signed it
// and its nonce, for the proof of the answer (Prove).
func (v *Verifier) Verify(h http.Header, secrets []string, q Request, self func(host string) bool, now time.Time) (secret, nonce string, err error) {
	raw := h.Get(Header)
	if raw == "" {
		return "", "", ErrMissing
	}
	f := strings.Split(raw, " ")
	if len(f) != 4 || f[0] != version || len(f[1]) > 20 || len(f[2]) != enc.EncodedLen(nonceBytes) || len(f[3]) != enc.EncodedLen(macBytes) {
		return "", "", ErrBadForm
	}
	ts, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return "", "", ErrBadForm
	}
	got, err := enc.DecodeString(f[3])
	if err != nil {
		return "", "", ErrBadForm
	}
	msg := q.message(f[1], f[2])
	for _, s := range secrets {
		if s != "" && hmac.Equal(got, mac(s, msg)) {
			secret = s
			break
		}
	}
	if secret == "" {
		return "", "", ErrBadMAC
	}
	if self == nil || !self(q.Host) {
		return "", "", ErrNotSelf
	}
	t := time.Unix(ts, 0)
	if t.Before(now.Add(-v.skew)) || t.After(now.Add(v.skew)) {
		return "", "", ErrStale
	}
	if !v.remember(f[2], ts, now) {
		return "", "", ErrReplay
	}
	return secret, f[2], nil
}

// remember records a nonce; false if it was seen before (or may have been).
func (v *Verifier) remember(nonce string, ts int64, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if ts <= v.floor {
		return false
	}
	if _, dup := v.seen[nonce]; dup {
		return false
	}
	// Forget what is out of the window anyway, oldest first.
	old := now.Add(-v.skew).Unix()
	for v.head < len(v.order) && (v.seen[v.order[v.head]] < old || len(v.order)-v.head >= v.max) {
		n := v.order[v.head]
		if t := v.seen[n]; t >= old && t > v.floor {
			v.floor = t // forgotten while still in the window
		}
		delete(v.seen, n)
		v.order[v.head] = ""
		v.head++
	}
	if v.head > len(v.order)/2 && v.head > 1024 {
		v.order = append(v.order[:0], v.order[v.head:]...)
		v.head = 0
	}
	if ts <= v.floor {
		return false
	}
	v.seen[nonce] = ts
	v.order = append(v.order, nonce)
	return true
}

func (q Request) proofMessage(nonce string) []byte {
	return []byte("toolstackd pool answer " + version + "\n" + strconv.Quote(nonce) + "\n" + strconv.Quote(q.Host) + "\n")
}

// Prove sets the proof of an answer to the request q whose signature
// Verify accepted with secret and nonce.
func Prove(h http.Header, secret, nonce string, q Request) {
	h.Set(ProofHeader, enc.EncodeToString(mac(secret, q.proofMessage(nonce))))
}

// CheckProof reports whether h holds the receiver's proof for the
// request q signed with nonce, under one of secrets.
func CheckProof(h http.Header, secrets []string, nonce string, q Request) bool {
	got, err := enc.DecodeString(h.Get(ProofHeader))
	if err != nil || len(got) != macBytes {
		return false
	}
	msg := q.proofMessage(nonce)
	for _, s := range secrets {
		if s != "" && hmac.Equal(got, mac(s, msg)) {
			return true
		}
	}
	return false
}

// LocalHost reports whether host is the address the request r arrived
// at (its connection's local address), one of the ways a host is named
// by a peer that reaches it without --advertise.
func LocalHost(r *http.Request, host string) bool {
	a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || a == nil {
		return false
	}
	return SameAddr(a.String(), host)
}

// SameAddr reports whether two "ip:port" addresses are the same (IPs
// compared by value).
func SameAddr(a, b string) bool {
	if a == b {
		return true
	}
	ah, ap, err1 := net.SplitHostPort(a)
	bh, bp, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || ap != bp {
		return false
	}
	ai, bi := net.ParseIP(ah), net.ParseIP(bh)
	return ai != nil && bi != nil && ai.Equal(bi)
}

// Seal encrypts a value hosts of the pool pass each other (a new secret
// during a rotation) under a key derived from secret and purpose, so that
// only holders of the secret read it, whoever else sees the request.
// AES-256-GCM with a random nonce; purpose is bound in as associated data.
func Seal(secret, purpose, plain string) (string, error) {
	aead, err := sealer(secret, purpose)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	return version + "." + enc.EncodeToString(aead.Seal(nonce, nonce, []byte(plain), []byte(purpose))), nil
}

// ErrSealed is a sealed value that none of the secrets opens.
var ErrSealed = errors.New("peerauth: the sealed value does not open with this host's secrets")

// Open decrypts what Seal made under one of secrets.
func Open(secrets []string, purpose, sealed string) (string, error) {
	body, ok := strings.CutPrefix(sealed, version+".")
	if !ok || len(body) > 4096 {
		return "", ErrSealed
	}
	raw, err := enc.DecodeString(body)
	if err != nil {
		return "", ErrSealed
	}
	for _, s := range secrets {
		if s == "" {
			continue
		}
		aead, err := sealer(s, purpose)
		if err != nil || len(raw) < aead.NonceSize() {
			continue
		}
		if plain, err := aead.Open(nil, raw[:aead.NonceSize()], raw[aead.NonceSize():], []byte(purpose)); err == nil {
			return string(plain), nil
		}
	}
	return "", ErrSealed
}

func sealer(secret, purpose string) (cipher.AEAD, error) {
	block, err := aes.NewCipher(mac(secret, []byte("toolstackd pool seal "+version+"\n"+purpose)))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
