package contenthash

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSpellings(t *testing.T) {
	h := Sum([]byte("hello\n"))
	const hexHello = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
	require.Equal(t, hexHello, h.Hex())
	require.Equal(t, "sha256:"+hexHello, h.String())
	got, err := Of(strings.NewReader("hello\n"))
	require.NoError(t, err)
	require.Equal(t, h, got)
	for _, s := range []string{hexHello, "sha256:" + hexHello, strings.ToUpper(hexHello), " sha256:" + hexHello + "\n"} {
		p, err := Parse(s)
		require.NoError(t, err, s)
		require.Equal(t, h, p, s)
	}
	for _, s := range []string{"", "sha256:", hexHello[:63], hexHello + "0", "sha1:" + hexHello, strings.Repeat("g", 64)} {
		_, err := Parse(s)
		require.Error(t, err, s)
	}
	_, err = ParseHex(strings.ToUpper(hexHello))
	require.Error(t, err, "a blob name is lowercase only")
	require.Equal(t, "", Hash{}.String())
}

func TestJSON(t *testing.T) {
	type entry struct {
		Hash Hash `json:"hash,omitzero"`
	}
	b, err := json.Marshal(entry{Hash: Sum([]byte("x"))})
	require.NoError(t, err)
	var back entry
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, Sum([]byte("x")), back.Hash)
	b, err = json.Marshal(entry{})
	require.NoError(t, err)
	require.Equal(t, "{}", string(b), "no hash, no field")
	require.Error(t, json.Unmarshal([]byte(`{"hash":"ABC"}`), &back))
}

func FuzzParse(f *testing.F) {
	f.Add("sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03")
	f.Add("zz")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := Parse(s)
		if err == nil {
			again, err := Parse(h.String())
			require.NoError(t, err)
			require.Equal(t, h, again)
		}
	})
}
