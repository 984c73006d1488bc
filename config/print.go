package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Outputs are the formats Print writes.
var Outputs = []string{"yaml", "json"}

// Print writes cfg as the configuration file that gives it, in output
// ("yaml" or "json"): the file's keys with every default and derived value
// filled in, enums and durations as a file writes them, a secret given
// inline Redacted and a token that is not set null. Read back as a
// configuration file it gives the same configuration, and Print writes the
// same document again; a file with a Redacted secret is refused until the
// secret is written back.
func Print(w io.Writer, cfg *Config, output string) error {
	doc := node(reflect.ValueOf(effective(cfg)).Elem())
	if output == "json" {
		var b bytes.Buffer
		writeJSON(&b, doc, "")
		b.WriteByte('\n')
		_, err := w.Write(b.Bytes())
		return err
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return err
	}
	return enc.Close()
}

// formatDuration writes d as a file would: Go's duration syntax without its
// zero units (10m, 200ms, 1m30s, 1.5s, 720h, 1h30s, 0s), which
// time.ParseDuration reads back exactly.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-len("0s")]
	}
	if i := strings.Index(s, "h0m"); i >= 0 {
		s = s[:i+1] + s[i+len("h0m"):]
	}
	return s
}

// node is v, a value of the file's shape, as a YAML node: a struct is a
// mapping of its keys in field order (a section that is a nil pointer is
// left out), a map a mapping sorted by key, a nil pointer null.
func node(v reflect.Value) *yaml.Node {
	if v.Type() == durationType {
		return scalar("!!str", formatDuration(time.Duration(v.Int())))
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return scalar("!!null", "null")
		}
		return node(v.Elem())
	case reflect.Struct:
		m := &yaml.Node{Kind: yaml.MappingNode}
		for i, name := range fieldsOf(v.Type()).names {
			f := v.Field(i)
			if f.Kind() == reflect.Pointer && f.Type().Elem().Kind() == reflect.Struct && f.IsNil() {
				continue
			}
			m.Content = append(m.Content, scalar("!!str", name), node(f))
		}
		return m
	case reflect.Map:
		m := &yaml.Node{Kind: yaml.MappingNode}
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		for _, k := range keys {
			m.Content = append(m.Content, scalar("!!str", k.String()), node(v.MapIndex(k)))
		}
		return m
	case reflect.Slice:
		s := &yaml.Node{Kind: yaml.SequenceNode}
		for i := range v.Len() {
			s.Content = append(s.Content, node(v.Index(i)))
		}
		return s
	case reflect.String:
		return scalar("!!str", v.String())
	case reflect.Bool:
		return scalar("!!bool", strconv.FormatBool(v.Bool()))
	case reflect.Int, reflect.Int64:
		return scalar("!!int", strconv.FormatInt(v.Int(), 10))
	case reflect.Float64:
		f := strconv.FormatFloat(v.Float(), 'f', -1, 64)
		if !strings.Contains(f, ".") {
			f += ".0"
		}
		return scalar("!!float", f)
	}
	panic(fmt.Sprintf("config: the file shape has a field of kind %v", v.Kind()))
}

func scalar(tag, value string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: value}
}

// writeJSON writes n as indented JSON, keys in n's order.
func writeJSON(b *bytes.Buffer, n *yaml.Node, indent string) {
	inner := indent + "  "
	switch n.Kind {
	case yaml.MappingNode, yaml.SequenceNode:
		open, end, step := "[", "]", 1
		if n.Kind == yaml.MappingNode {
			open, end, step = "{", "}", 2
		}
		if len(n.Content) == 0 {
			b.WriteString(open + end)
			return
		}
		b.WriteString(open + "\n")
		for i := 0; i < len(n.Content); i += step {
			b.WriteString(inner)
			if step == 2 {
				writeJSONString(b, n.Content[i].Value)
				b.WriteString(": ")
			}
			writeJSON(b, n.Content[i+step-1], inner)
			if i+step < len(n.Content) {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(indent + end)
	case yaml.ScalarNode:
		if n.Tag == "!!str" {
			writeJSONString(b, n.Value)
			return
		}
		b.WriteString(n.Value)
	}
}

func writeJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)       // a string always encodes
	b.Truncate(b.Len() - 1) // Encode's newline
}
