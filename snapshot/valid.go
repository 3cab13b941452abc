package snapshot

import "fmt"

// maxScopeLen bounds scope ids; hosts use tool call ids, which are short.
const maxScopeLen = 128

// ValidScope reports whether scope can be used as a scope id: 1 to 128 bytes
// of [A-Za-z0-9._:@-], and not "." or "..". The character set keeps scope
// ids safe to use in file names and log lines (no "/", NUL, spaces or
// control characters); "." and ".." are refused because they are path
// components with a meaning of their own.
func ValidScope(scope string) error {
	if len(scope) == 0 || len(scope) > maxScopeLen {
		return fmt.Errorf("snapshot: scope id must be 1 to %d bytes long, got %d", maxScopeLen, len(scope))
	}
	for i := 0; i < len(scope); i++ {
		if !scopeByte(scope[i]) {
			return fmt.Errorf("snapshot: scope id %q: byte %#x at %d is not one of [A-Za-z0-9._:@-]", scope, scope[i], i)
		}
	}
	if scope == "." || scope == ".." {
		return fmt.Errorf("snapshot: scope id %q is not allowed", scope)
	}
	return nil
}

func scopeByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '.', '_', ':', '@', '-':
		return true
	}
	return false
}

// ValidID reports whether id has the form Create gives snapshot ids: 16
// lowercase hex digits (the creation time in unix ns, so ids sort by
// creation), "-", then 1 to 32 lowercase hex digits. Manifest file names are
// built from ids, so Open checks every name against this.
func ValidID(id string) error {
	if len(id) < 18 || len(id) > 16+1+32 || id[16] != '-' || !lowerHex(id[:16]) || !lowerHex(id[17:]) {
		return fmt.Errorf("snapshot: bad snapshot id %q", id)
	}
	return nil
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return len(s) > 0
}
