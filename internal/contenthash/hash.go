package contenthash

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"
)

// Hash is the SHA-256 of a file's content. The zero Hash stands for none
// (not a regular file, or not hashed).
type Hash [sha256.Size]byte

// Prefix starts the protocol's spelling of a hash.
const Prefix = "sha256:"

// Sum returns the hash of b.
func Sum(b []byte) Hash { return sha256.Sum256(b) }

// Of hashes everything r yields.
func Of(r io.Reader) (Hash, error) {
	h := New()
	if _, err := io.CopyBuffer(h, r, make([]byte, 256<<10)); err != nil {
		return Hash{}, err
	}
	return h.Sum(), nil
}

// Hasher hashes what is written to it.
type Hasher struct{ h hash.Hash }

// New returns a Hasher with nothing written yet.
func New() *Hasher { return &Hasher{h: sha256.New()} }

func (h *Hasher) Write(p []byte) (int, error) { return h.h.Write(p) }

// Sum returns the hash of everything written so far.
func (h *Hasher) Sum() Hash {
	var s Hash
	h.h.Sum(s[:0])
	return s
}

// IsZero reports whether h is the zero Hash (none).
func (h Hash) IsZero() bool { return h == Hash{} }

// Hex is h in lowercase hex: a blob's name, a manifest's spelling.
func (h Hash) Hex() string { return hex.EncodeToString(h[:]) }

// String is h as the control protocol spells it, "sha256:<hex>", or ""
// for the zero Hash.
func (h Hash) String() string {
	if h.IsZero() {
		return ""
	}
	return Prefix + h.Hex()
}

// ParseHex reads exactly 64 lowercase hex digits, the only form a blob
// name or a manifest takes: anything else could name two files for one
// content.
func ParseHex(s string) (Hash, error) {
	var h Hash
	if len(s) != 2*len(h) || strings.ToLower(s) != s {
		return Hash{}, fmt.Errorf("not a lowercase hex sha256: %q", clip(s))
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return Hash{}, fmt.Errorf("not a lowercase hex sha256: %q", clip(s))
	}
	return h, nil
}

// Parse reads a hash a user or client gave: "sha256:<hex>" or the bare
// hex, in either case.
func Parse(s string) (Hash, error) {
	hexPart := strings.ToLower(strings.TrimPrefix(strings.TrimSpace(s), Prefix))
	h, err := ParseHex(hexPart)
	if err != nil {
		return Hash{}, errors.New("a hash is sha256: and 64 hex digits, or the 64 hex digits alone")
	}
	return h, nil
}

// MarshalText writes the hex spelling (manifests); the zero Hash is empty.
func (h Hash) MarshalText() ([]byte, error) {
	if h.IsZero() {
		return nil, nil
	}
	return []byte(h.Hex()), nil
}

// UnmarshalText reads the hex spelling; empty is the zero Hash.
func (h *Hash) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*h = Hash{}
		return nil
	}
	v, err := ParseHex(string(b))
	if err != nil {
		return err
	}
	*h = v
	return nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
