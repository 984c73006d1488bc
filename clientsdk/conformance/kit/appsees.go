package kit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
)

// Check compares a response the application got with what it must see, for
// Go runners: every difference, none when it matches. A runner whose
// application got an error instead checks want.Error itself.
func (want AppSees) Check(status int, header http.Header, body []byte) []string {
	if want.Error != "" {
		return []string{fmt.Sprintf("the application got a %d response, want the %s error", status, want.Error)}
	}
	var out []string
	if status != want.Status {
		out = append(out, fmt.Sprintf("status = %d, want %d", status, want.Status))
	}
	for _, k := range sortedKeys(want.Headers) {
		v, ok := header[http.CanonicalHeaderKey(k)]
		switch w := want.Headers[k]; {
		case w == nil && ok:
			out = append(out, fmt.Sprintf("header %s = %q, want none", k, strings.Join(v, ", ")))
		case w != nil && strings.Join(v, ", ") != *w:
			out = append(out, fmt.Sprintf("header %s = %q, want %q", k, strings.Join(v, ", "), *w))
		}
	}
	if want.Body != nil && string(body) != *want.Body {
		out = append(out, fmt.Sprintf("body = %q, want %q", truncate(string(body), 500), *want.Body))
	}
	if want.BodyJSON != nil {
		var doc any
		if err := json.Unmarshal(body, &doc); err != nil {
			return append(out, fmt.Sprintf("body is not JSON: %q", truncate(string(body), 500)))
		}
		for _, path := range sortedKeys(want.BodyJSON) {
			got := at(doc, path)
			if !reflect.DeepEqual(got, want.BodyJSON[path]) {
				g, _ := json.Marshal(got)
				w, _ := json.Marshal(want.BodyJSON[path])
				out = append(out, fmt.Sprintf("body %s = %s, want %s", path, g, w))
			}
		}
	}
	return out
}

// at is the value at a dotted path of a JSON document (array elements by
// index), nil when there is none.
func at(doc any, path string) any {
	for _, key := range strings.Split(path, ".") {
		switch v := doc.(type) {
		case map[string]any:
			doc = v[key]
		case []any:
			i, err := strconv.Atoi(key)
			if err != nil || i < 0 || i >= len(v) {
				return nil
			}
			doc = v[i]
		default:
			return nil
		}
	}
	return doc
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
