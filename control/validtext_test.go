package control

import "testing"

func TestValidText(t *testing.T) {
	for _, c := range []struct {
		raw string
		ok  bool
	}{
		{`{"path":"a.txt","content":"plain"}`, true},
		{`{"content":"\ud83d\ude00 a pair"}`, true},
		{`{"content":"a literal \\ud800, escaped backslash"}`, true},
		{`{"content":"\u00e9\u4e2d"}`, true},
		{`{"content":"A\ud800B"}`, false},
		{`{"content":"\udc00"}`, false},
		{`{"content":"\ud800\u0041"}`, false},
		{"{\"content\":\"A\xff\xfeC\"}", false},
		{`{"content":"unfinished \u12"}`, true}, // json.Unmarshal refuses it
		{`{"k\ud800":1}`, false},
	} {
		if err := validText([]byte(c.raw)); (err == nil) != c.ok {
			t.Errorf("validText(%s) = %v, want ok=%v", c.raw, err, c.ok)
		}
	}
}

func FuzzValidText(f *testing.F) {
	for _, s := range []string{`{"a":"\ud800"}`, `"\\"`, `{"x":"\ud83d\ude00"}`, "\"\xff\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		validText(raw) // must not panic
	})
}
