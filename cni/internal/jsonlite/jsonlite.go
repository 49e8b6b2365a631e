// Package jsonlite reads and writes the little JSON the CNI plugin needs
// without encoding/json. The plugin is exec'd once per pod: reflection
// based decoding, and the code it links, were a quarter of the plugin's
// CPU per ADD (measured: 1.62 ms per exec against 1.12 ms with neither).
// It follows RFC 8259 the way encoding/json does (invalid UTF-8 inside
// strings accepted and read as U+FFFD, nesting limited to 10000); the
// fuzz tests hold it to encoding/json's answers.
package jsonlite

import (
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth is encoding/json's nesting limit.
const maxDepth = 10000

// SyntaxError is input that is not JSON, with the byte offset where that
// became clear.
type SyntaxError struct {
	Msg    string
	Offset int
}

func (e *SyntaxError) Error() string {
	return e.Msg + " at offset " + strconv.Itoa(e.Offset)
}

// TypeError is valid JSON of another kind than the one asked for.
type TypeError struct{ Got string }

func (e *TypeError) Error() string { return "want a JSON object, got " + e.Got }

// Member is one member of an object: its key, decoded, and its value as
// it appears in the input (no surrounding whitespace).
type Member struct {
	Key   string
	Value []byte
}

// Valid reports whether data is exactly one JSON value, with optional
// whitespace around it.
func Valid(data []byte) bool {
	p := parser{data: data}
	_, err := p.document()
	return err == nil
}

// Object returns the members of data, which must be one JSON object, in
// input order (a key given twice appears twice). A JSON null yields no
// members and no error, as encoding/json leaves a struct alone for it;
// any other kind of value is a *TypeError.
func Object(data []byte) ([]Member, error) {
	p := parser{data: data, collect: true}
	v, err := p.document()
	if err != nil {
		return nil, err
	}
	switch k := Kind(v); k {
	case "object":
		if p.members == nil {
			return []Member{}, nil // {}: not null
		}
		return p.members, nil
	case "null":
		return nil, nil
	default:
		return nil, &TypeError{Got: k}
	}
}

// Kind names the kind of a valid JSON value from its first byte: object,
// array, string, number, boolean or null.
func Kind(v []byte) string {
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	default:
		return "number"
	}
}

type parser struct {
	data    []byte
	pos     int
	depth   int
	collect bool     // record the top-level object's members
	members []Member // the top-level object's, when collect
}

func (p *parser) fail(msg string) error { return &SyntaxError{Msg: msg, Offset: p.pos} }

func (p *parser) unexpected(context string) error {
	if p.pos >= len(p.data) {
		return p.fail("unexpected end of JSON input")
	}
	return p.fail("invalid character " + strconv.QuoteRune(rune(p.data[p.pos])) + " " + context)
}

func (p *parser) ws() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// document parses one value and trailing whitespace; it returns the value.
func (p *parser) document() ([]byte, error) {
	p.ws()
	start := p.pos
	if err := p.value(true); err != nil {
		return nil, err
	}
	v := p.data[start:p.pos]
	p.ws()
	if p.pos != len(p.data) {
		return nil, p.unexpected("after top-level value")
	}
	return v, nil
}

func (p *parser) value(top bool) error {
	if p.pos >= len(p.data) {
		return p.unexpected("")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(top)
	case c == '[':
		return p.array()
	case c == '"':
		_, err := p.str()
		return err
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number()
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	default:
		return p.unexpected("looking for beginning of value")
	}
}

func (p *parser) nest() error {
	p.depth++
	if p.depth > maxDepth {
		return p.fail("exceeded max depth")
	}
	return nil
}

// open enters an object or array at its opening byte: empty when close
// follows at once (and is consumed).
func (p *parser) open(close byte) (empty bool, err error) {
	if err := p.nest(); err != nil {
		return false, err
	}
	p.pos++
	p.ws()
	if p.pos < len(p.data) && p.data[p.pos] == close {
		p.pos++
		p.depth--
		return true, nil
	}
	return false, nil
}

// next reads what follows a member or an element: ',' (more to come) or
// close (done, consumed).
func (p *parser) next(close byte, context string) (done bool, err error) {
	p.ws()
	if p.pos >= len(p.data) {
		return false, p.unexpected("")
	}
	switch p.data[p.pos] {
	case ',':
		p.pos++
		return false, nil
	case close:
		p.pos++
		p.depth--
		return true, nil
	}
	return false, p.unexpected(context)
}

func (p *parser) object(top bool) error {
	if empty, err := p.open('}'); empty || err != nil {
		return err
	}
	for {
		p.ws()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return p.unexpected("looking for beginning of object key string")
		}
		keyStart := p.pos
		if _, err := p.str(); err != nil {
			return err
		}
		keyRaw := p.data[keyStart:p.pos]
		p.ws()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return p.unexpected("after object key")
		}
		p.pos++
		p.ws()
		valStart := p.pos
		if err := p.value(false); err != nil {
			return err
		}
		if top && p.collect {
			key, _ := Unquote(keyRaw) // scanned above: cannot fail
			p.members = append(p.members, Member{Key: key, Value: p.data[valStart:p.pos]})
		}
		if done, err := p.next('}', "after object key:value pair"); done || err != nil {
			return err
		}
	}
}

func (p *parser) array() error {
	if empty, err := p.open(']'); empty || err != nil {
		return err
	}
	for {
		p.ws()
		if err := p.value(false); err != nil {
			return err
		}
		if done, err := p.next(']', "after array element"); done || err != nil {
			return err
		}
	}
}

// str scans a string token starting at its opening quote.
func (p *parser) str() (escaped bool, err error) {
	p.pos++ // '"'
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			return escaped, nil
		case c < 0x20:
			return escaped, p.unexpected("in string literal")
		case c == '\\':
			escaped = true
			p.pos++
			if p.pos >= len(p.data) {
				return escaped, p.unexpected("")
			}
			switch p.data[p.pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.pos++
			case 'u':
				p.pos++
				for range 4 {
					if p.pos >= len(p.data) || !isHex(p.data[p.pos]) {
						return escaped, p.unexpected("in \\u hexadecimal character escape")
					}
					p.pos++
				}
			default:
				return escaped, p.unexpected("in string escape code")
			}
		default:
			p.pos++
		}
	}
	return escaped, p.unexpected("")
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func (p *parser) digits() error {
	if p.pos >= len(p.data) || !isDigit(p.data[p.pos]) {
		return p.unexpected("in numeric literal")
	}
	for p.pos < len(p.data) && isDigit(p.data[p.pos]) {
		p.pos++
	}
	return nil
}

func (p *parser) number() error {
	if p.data[p.pos] == '-' {
		p.pos++
	}
	if p.pos < len(p.data) && p.data[p.pos] == '0' {
		p.pos++
	} else if err := p.digits(); err != nil {
		return err
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if err := p.digits(); err != nil {
			return err
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if err := p.digits(); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) literal(word string) error {
	for i := 0; i < len(word); i++ {
		if p.pos >= len(p.data) || p.data[p.pos] != word[i] {
			return p.unexpected("in literal " + word + " (expecting " + strconv.QuoteRune(rune(word[i])) + ")")
		}
		p.pos++
	}
	return nil
}

// Unquote decodes a string token (quotes included) as encoding/json does:
// escapes resolved, an unpaired surrogate or a byte that is not UTF-8
// read as U+FFFD.
func Unquote(raw []byte) (string, error) {
	p := parser{data: raw}
	if len(raw) == 0 || raw[0] != '"' {
		return "", p.unexpected("looking for beginning of string")
	}
	escaped, err := p.str()
	if err != nil {
		return "", err
	}
	if p.pos != len(raw) {
		return "", p.unexpected("after string")
	}
	s := raw[1 : len(raw)-1]
	if !escaped && utf8.Valid(s) {
		return string(s), nil
	}
	out := make([]byte, 0, len(s)+utf8.UTFMax)
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			if c < utf8.RuneSelf {
				out = append(out, c)
				i++
				continue
			}
			r, size := utf8.DecodeRune(s[i:])
			out = utf8.AppendRune(out, r) // RuneError for a bad byte
			i += size
			continue
		}
		switch s[i+1] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := hex4(s[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					r2 = hex4(s[i+2:])
				}
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					out = utf8.AppendRune(out, dec)
					i += 6
					continue
				}
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
			continue
		default: // '"', '\\', '/'
			out = append(out, s[i+1])
		}
		i += 2
	}
	return string(out), nil
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

const hexDigits = "0123456789abcdef"

// AppendQuote appends s as a JSON string exactly as encoding/json writes
// it with HTML escaping off: control characters escaped, U+2028 and
// U+2029 escaped, bytes that are not UTF-8 written as \ufffd.
func AppendQuote(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c >= 0x20:
				dst = append(dst, c)
			case c == '\b':
				dst = append(dst, '\\', 'b')
			case c == '\f':
				dst = append(dst, '\\', 'f')
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

// AppendCompact appends valid JSON data without its insignificant
// whitespace (encoding/json's Compact). The result holds no newline, so
// it can travel in a newline-framed message.
func AppendCompact(dst, data []byte) []byte {
	inString, escape := false, false
	for _, c := range data {
		switch {
		case inString:
			switch {
			case escape:
				escape = false
			case c == '\\':
				escape = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			continue
		}
		dst = append(dst, c)
	}
	return dst
}
