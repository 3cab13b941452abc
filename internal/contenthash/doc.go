// Package contenthash names file contents by their SHA-256: one typed
// value (Hash) from the moment content is hashed to the moment a hash is
// shown, compared or used as a name. It has the two spellings stagefs
// writes: bare lowercase hex (Hex) names snapshot blobs and fills the
// snapshot manifests; "sha256:" and the hex (String) is the control
// protocol's. Parse reads either.
package contenthash
