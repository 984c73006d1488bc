package config

import (
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// decode fills f from raw, the file with the environment and flags over it
// (nested maps of YAML values; the environment's and flags' values are
// strings). Every problem is reported in the configuration's words: an
// unknown key by its path, with the closest known key or the allowed ones,
// and a value of the wrong type with the key, the value and what is allowed.
// A key whose value is null is absent.
func decode(raw map[string]any, f *fileConfig) []error {
	d := &decoder{}
	d.value("", raw, reflect.ValueOf(f).Elem())
	return d.errs
}

type decoder struct{ errs []error }

func (d *decoder) fail(key string, value any, allowed string) {
	d.errs = append(d.errs, &FieldError{Key: key, Value: value, Allowed: allowed})
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	tenantType   = reflect.TypeFor[fileTenant]()
)

// value decodes raw into v, the field at key.
func (d *decoder) value(key string, raw any, v reflect.Value) {
	if raw == nil {
		return
	}
	if v.Type() == durationType {
		d.duration(key, raw, v)
		return
	}
	if _, isMap := raw.(map[string]any); v.Type() == tenantType && !isMap {
		// The shorthand of a tenant's entry: its weight.
		if _, ok := whole(raw); !ok {
			d.fail(key, raw, "a weight (a whole number) or a mapping of keys: "+strings.Join(fieldsOf(tenantType).names, ", "))
			return
		}
		d.value(key, raw, v.Field(fieldsOf(tenantType).index["weight"]))
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		elem := reflect.New(v.Type().Elem())
		d.value(key, raw, elem.Elem())
		v.Set(elem)
	case reflect.Interface:
		v.Set(reflect.ValueOf(raw))
	case reflect.Struct:
		d.mapping(key, raw, v)
	case reflect.Map:
		m, ok := raw.(map[string]any)
		if !ok {
			d.fail(key, raw, "a mapping of names to values")
			return
		}
		out := reflect.MakeMapWithSize(v.Type(), len(m))
		for k, item := range m {
			elem := reflect.New(v.Type().Elem()).Elem()
			d.value(join(key, k), item, elem)
			out.SetMapIndex(reflect.ValueOf(k), elem)
		}
		v.Set(out)
	case reflect.Slice:
		d.list(key, raw, v)
	case reflect.String:
		if s, ok := text(raw); ok {
			v.SetString(s)
			return
		}
		d.fail(key, raw, "a text value")
	case reflect.Bool:
		switch b := raw.(type) {
		case bool:
			v.SetBool(b)
			return
		case string:
			if p, err := strconv.ParseBool(strings.TrimSpace(b)); err == nil {
				v.SetBool(p)
				return
			}
		}
		d.fail(key, raw, "true or false")
	case reflect.Int, reflect.Int64:
		if n, ok := whole(raw); ok && !v.OverflowInt(n) {
			v.SetInt(n)
			return
		}
		d.fail(key, raw, "a whole number")
	case reflect.Float64:
		if x, ok := number(raw); ok {
			v.SetFloat(x)
			return
		}
		d.fail(key, raw, "a number")
	default:
		panic(fmt.Sprintf("config: the file shape has a field of kind %v at %s", v.Kind(), key))
	}
}

// mapping decodes a mapping into the struct v, refusing keys v has no field for.
func (d *decoder) mapping(key string, raw any, v reflect.Value) {
	fields := fieldsOf(v.Type())
	m, ok := raw.(map[string]any)
	if !ok {
		d.fail(key, raw, "a mapping of keys: "+strings.Join(fields.names, ", "))
		return
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		i, known := fields.index[k]
		if !known {
			d.errs = append(d.errs, unknownKey(join(key, k), k, fields.names))
			continue
		}
		d.value(join(key, k), m[k], v.Field(i))
	}
}

// list decodes a sequence into the slice v. A list of strings may be one
// string of comma-separated items (POLYGATE_BACKEND__REDIS__ADDRS=a:1,b:2).
// An item of a list of mappings with a valid name is keyed by its name
// (scopes.chat.sources.primary), as the checks key it; others by index.
func (d *decoder) list(key string, raw any, v reflect.Value) {
	items, ok := raw.([]any)
	if s, isText := raw.(string); !ok && isText && v.Type().Elem().Kind() == reflect.String {
		items, ok = []any{}, true
		if s != "" {
			for _, item := range strings.Split(s, ",") {
				items = append(items, item)
			}
		}
	}
	if !ok {
		d.fail(key, raw, "a list")
		return
	}
	out := reflect.MakeSlice(v.Type(), len(items), len(items))
	for i, item := range items {
		ikey := fmt.Sprintf("%s[%d]", key, i)
		if m, ok := item.(map[string]any); ok {
			if name, ok := m["name"].(string); ok && ValidName(name) {
				ikey = join(key, name)
			}
		}
		d.value(ikey, item, out.Index(i))
	}
	v.Set(out)
}

// duration decodes a Go duration with a unit. A bare number is refused: it
// would otherwise mean nanoseconds.
func (d *decoder) duration(key string, raw any, v reflect.Value) {
	const allowed = "a duration with a unit, e.g. 60s, 250ms or 1m30s"
	s, ok := raw.(string)
	if !ok {
		if _, isNumber := number(raw); isNumber {
			d.fail(key, raw, "a duration needs a unit: "+allowed)
			return
		}
		d.fail(key, raw, allowed)
		return
	}
	p, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		d.fail(key, raw, allowed)
		return
	}
	v.SetInt(int64(p))
}

// text is a scalar as text: YAML reads `version: 2` as a number, the
// environment gives every value as text.
func text(raw any) (string, bool) {
	switch x := raw.(type) {
	case string:
		return x, true
	case bool:
		return strconv.FormatBool(x), true
	case int:
		return strconv.Itoa(x), true
	case int64:
		return strconv.FormatInt(x, 10), true
	case uint64:
		return strconv.FormatUint(x, 10), true
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), true
	}
	return "", false
}

// whole is a whole number, from a YAML number or a text (the environment).
func whole(raw any) (int64, bool) {
	switch x := raw.(type) {
	case int:
		return int64(x), true
	case int64:
		return x, true
	case uint64:
		return int64(x), x <= math.MaxInt64
	case float64:
		if x == math.Trunc(x) && x >= math.MinInt64 && x < math.MaxInt64 {
			return int64(x), true
		}
	case string:
		n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
		return n, err == nil
	}
	return 0, false
}

// number is a number, from a YAML number or a text (the environment).
func number(raw any) (float64, bool) {
	switch x := raw.(type) {
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	case float64:
		return x, !math.IsNaN(x) && !math.IsInf(x, 0)
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		return f, err == nil && !math.IsNaN(f) && !math.IsInf(f, 0)
	}
	return 0, false
}

// fields are a file struct's keys (its koanf tags), in field order.
type fields struct {
	names []string
	index map[string]int
}

func fieldsOf(t reflect.Type) fields {
	fs := fields{index: map[string]int{}}
	for i := range t.NumField() {
		name := t.Field(i).Tag.Get("koanf")
		fs.names = append(fs.names, name)
		fs.index[name] = i
	}
	return fs
}

func join(key, name string) string {
	if key == "" {
		return name
	}
	return key + "." + name
}

// KeyError is a key the configuration does not have.
type KeyError struct {
	// Key is the key's path, dotted, e.g. "scopes.chat.max_atempts".
	Key string
	// Suggest is the known key closest to it ("" when none is close);
	// Allowed are the keys allowed where it is written.
	Suggest string
	Allowed []string
}

func (e *KeyError) Error() string {
	if e.Suggest != "" {
		return fmt.Sprintf("%s: unknown key; did you mean %s?", cut(e.Key, maxLine), e.Suggest)
	}
	return fmt.Sprintf("%s: unknown key; allowed here: %s", cut(e.Key, maxLine), strings.Join(e.Allowed, ", "))
}

func unknownKey(key, name string, allowed []string) error {
	return &KeyError{Key: key, Suggest: closest(name, allowed), Allowed: allowed}
}

// closest is the word of words nearest to s, if it is a likely typo of it:
// at most two edits away, and fewer edits than s has letters. Ties go to the
// first word.
func closest(s string, words []string) string {
	if len(s) > 64 {
		return "" // no key is that long: not a typo
	}
	best, bestDist := "", 3
	for _, w := range words {
		if d := edits(s, w); d < bestDist && d < len(s) {
			best, bestDist = w, d
		}
	}
	return best
}

// edits is the Levenshtein distance between a and b, in bytes.
func edits(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
