package jsonlite

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

var seeds = []string{
	`{}`, ` { "a" : 1 , "b" : [ true , false , null ] } `, `{"cniVersion":"1.1.0","name":"n","type":"flock"}`,
	`{"a":{"b":{"c":[1,2,{"d":"e"}]}}}`, `[]`, `[1,2]`, `"x"`, `null`, `true`, `-0.5e+10`, `0`, `-`, `01`, `1.`, `1e`,
	`{"a":1,}`, `{"a" 1}`, `{a:1}`, `[1,]`, `{"a":"\u00e9\ud83d\ude00\ud800\u0041\udc00"}`, `{"a":"\x"}`,
	"{\"a\":\"tab\there\"}", "{\"a\":\"\xff\xfe\"}", `{"a":"\/\b\f\n\r\t\"\\"}`, `{"a":1}{"b":2}`, `{"a":1} x`,
	`{"A":1,"a":2}`, `{"timeoutSeconds":"5"}`, `{"timeoutSeconds":5.0}`, `{"timeoutSeconds":1e3}`, `tru`, `nul`, ``, ` `,
	strings.Repeat("[", 10001) + strings.Repeat("]", 10001), strings.Repeat("[", 100) + strings.Repeat("]", 100),
}

func TestValidAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range seeds {
		if got, want := Valid([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Errorf("Valid(%.60q) = %v, encoding/json says %v", s, got, want)
		}
	}
}

func TestObject(t *testing.T) {
	m, err := Object([]byte(` {"a" : 1, "b":{"x":[1, "}"]}, "a":"\u0041"} `))
	if err != nil {
		t.Fatal(err)
	}
	want := []Member{{"a", []byte("1")}, {"b", []byte(`{"x":[1, "}"]}`)}, {"a", []byte(`"\u0041"`)}}
	if len(m) != len(want) {
		t.Fatalf("members %q, want %q", m, want)
	}
	for i := range m {
		if m[i].Key != want[i].Key || !bytes.Equal(m[i].Value, want[i].Value) {
			t.Errorf("member %d: %q=%s, want %q=%s", i, m[i].Key, m[i].Value, want[i].Key, want[i].Value)
		}
	}
	if m, err := Object([]byte("null")); err != nil || m != nil {
		t.Errorf("null: %v %v, want no members and no error", m, err)
	}
	var te *TypeError
	if _, err := Object([]byte(`[1]`)); !errors.As(err, &te) || te.Got != "array" {
		t.Errorf("array: %v, want a TypeError naming array", err)
	}
	var se *SyntaxError
	if _, err := Object([]byte(`{"a":1,}`)); !errors.As(err, &se) || se.Offset != 7 || !strings.Contains(err.Error(), "offset 7") {
		t.Errorf("trailing comma: %v, want a syntax error at offset 7", err)
	}
}

// Each string decodes as encoding/json decodes it.
func TestUnquoteAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range []string{`""`, `"plain"`, `"\u00e9\ud83d\ude00"`, `"\ud800\u0041"`, `"\udc00"`, `"\ud800"`, `"\ud800\ud800\udc00"`, "\"\xff\xc3\"", `"\/\b\f\n\r\t\"\\"`} {
		var want string
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if got, err := Unquote([]byte(s)); err != nil || got != want {
			t.Errorf("Unquote(%s) = %q, %v; want %q", s, got, err, want)
		}
	}
	for _, bad := range []string{``, `x`, `"`, `"a`, `"\q"`, `"a"b`, "\"\n\""} {
		if _, err := Unquote([]byte(bad)); err == nil {
			t.Errorf("Unquote(%q): no error", bad)
		}
	}
}

func marshalNoHTML(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

func TestAppendQuoteAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "a\"b\\c", "\x00\x01\x1f\b\f\n\r\t", "é😀", "\u2028\u2029", "\xff\xfe", "<&>", "\x7f"} {
		if got, want := AppendQuote(nil, s), marshalNoHTML(s); !bytes.Equal(got, want) {
			t.Errorf("AppendQuote(%q) = %s, want %s", s, got, want)
		}
	}
}

func FuzzValid(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, want := Valid(data), json.Valid(data)
		if got != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", data, got, want)
		}
		if !got {
			return
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, data); err != nil {
			t.Fatal(err)
		}
		if c := AppendCompact(nil, data); !bytes.Equal(c, compact.Bytes()) {
			t.Fatalf("AppendCompact(%q) = %q, encoding/json: %q", data, c, compact.Bytes())
		}
		members, err := Object(data)
		var obj map[string]any
		kind := Kind(bytes.TrimLeft(data, " \t\r\n"))
		if kind == "object" {
			if json.Unmarshal(data, &obj) != nil {
				return // valid, but not Go's (a number beyond float64)
			}
		}
		switch kind {
		case "null":
			if err != nil || members != nil {
				t.Fatalf("Object(null) = %v, %v", members, err)
			}
		default:
			var te *TypeError
			if !errors.As(err, &te) {
				t.Fatalf("Object(%q): %v, want a TypeError", data, err)
			}
		case "object":
			if err != nil {
				t.Fatalf("Object(%q): %v", data, err)
			}
			last := map[string][]byte{}
			for _, m := range members {
				last[m.Key] = m.Value
			}
			if len(last) != len(obj) {
				t.Fatalf("Object(%q): keys %v, encoding/json: %v", data, last, obj)
			}
			for k, raw := range last {
				var v any
				if err := json.Unmarshal(raw, &v); err != nil {
					t.Fatalf("member %q: value %q: %v", k, raw, err)
				}
				a, _ := json.Marshal(v)
				b, _ := json.Marshal(obj[k])
				if !bytes.Equal(a, b) {
					t.Fatalf("member %q = %s, encoding/json: %s", k, a, b)
				}
			}
		}
	})
}

func FuzzQuote(f *testing.F) {
	for _, s := range []string{"", "a\"b", "\x00\u2028", "\xff", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := AppendQuote(nil, s)
		if want := marshalNoHTML(s); !bytes.Equal(q, want) {
			t.Fatalf("AppendQuote(%q) = %s, encoding/json: %s", s, q, want)
		}
		if bytes.IndexByte(q, '\n') >= 0 {
			t.Fatalf("AppendQuote(%q) holds a newline", s)
		}
		var want string
		if err := json.Unmarshal(q, &want); err != nil {
			t.Fatal(err)
		}
		if got, err := Unquote(q); err != nil || got != want {
			t.Fatalf("Unquote(%s) = %q, %v; encoding/json: %q", q, got, err, want)
		}
	})
}

// FuzzUnquote feeds raw string tokens, escapes and all.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{`""`, `"\ud800\udc00"`, `"\ud800x"`, "\"\xff\"", `"\u00"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want string
		werr := json.Unmarshal(raw, &want)
		got, err := Unquote(raw)
		if (err == nil) != (werr == nil) {
			if werr != nil && !bytes.HasPrefix(bytes.TrimLeft(raw, " \t\r\n"), []byte(`"`)) {
				return // not a string token at all: Unquote takes no whitespace
			}
			if werr == nil && len(raw) > 0 && raw[0] != '"' {
				return // whitespace around the token: encoding/json skips it
			}
			if werr == nil && len(raw) > 0 && bytes.IndexAny(raw[len(raw)-1:], " \t\r\n") == 0 {
				return
			}
			t.Fatalf("Unquote(%q): %v; encoding/json: %v", raw, err, werr)
		}
		if err == nil && got != want {
			t.Fatalf("Unquote(%q) = %q, encoding/json %q", raw, got, want)
		}
	})
}
