package redisgate

import (
	"go/ast"
	goparser "go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// luaSources are the Lua files of the library.
func luaSources(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Lua sources: %v", err)
	}
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[f] = string(b)
	}
	return out
}

// TestLuaUsesLayoutsByName fails when Lua code counts a layout by hand: an
// argument or key indexed with a numeric literal (ARGV[8 + 13 * (i - 1)],
// KEYS[2]), a stride written as a number, or a positional reply table of
// variables ({ state, b.override, b.actor, ... }) where pack(L, {...}) names
// each field.
func TestLuaUsesLayoutsByName(t *testing.T) {
	bad := []struct {
		what string
		re   *regexp.Regexp
	}{
		{"ARGV/KEYS used directly (read them with read(L, argv, base))", regexp.MustCompile(`\b(ARGV|KEYS)\b`)},
		{"an argument or key indexed with a number", regexp.MustCompile(`\b(argv|keys)\s*\[[^\]]*[0-9]`)},
		{"a stride counted by hand", regexp.MustCompile(`[0-9]+\s*\*\s*\(\s*i\s*-\s*1\s*\)`)},
		{"a positional record (use pack with named fields)", regexp.MustCompile(`\{\s*[A-Za-z_][\w.]*\s*,\s*[A-Za-z_][\w.]*\s*,\s*[A-Za-z_][\w.]*\s*[,}]`)},
	}
	for name, src := range luaSources(t) {
		for n, line := range strings.Split(src, "\n") {
			code, _, _ := strings.Cut(line, "--")
			for _, b := range bad {
				if b.re.MatchString(code) {
					t.Errorf("%s:%d: %s: %s", name, n+1, b.what, strings.TrimSpace(line))
				}
			}
		}
	}
}

// TestLuaTwinsExist: every "-- twin: gate.F" or "-- twin: gate.(*T).M" in
// the Lua sources names a function or method that exists in package gate.
func TestLuaTwinsExist(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("../*.go")
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := goparser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		{
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok {
					continue
				}
				name := "gate." + fd.Name.Name
				if fd.Recv != nil && len(fd.Recv.List) == 1 {
					switch r := fd.Recv.List[0].Type.(type) {
					case *ast.StarExpr:
						name = "gate.(*" + r.X.(*ast.Ident).Name + ")." + fd.Name.Name
					case *ast.Ident:
						name = "gate." + r.Name + "." + fd.Name.Name
					}
				}
				have[name] = true
			}
		}
	}
	twin := regexp.MustCompile(`--\s*twin:\s*(\S+)`)
	n := 0
	for name, src := range luaSources(t) {
		for _, m := range twin.FindAllStringSubmatch(src, -1) {
			n++
			if !have[m[1]] {
				t.Errorf("%s: twin %s: no such function in package gate", name, m[1])
			}
		}
	}
	if n == 0 {
		t.Fatal("no twin annotations found")
	}
}

// TestLayoutNamesAreUnique: a layout's field names are its Lua table's
// keys, so each appears once, and none collides with the table's own keys.
func TestLayoutNamesAreUnique(t *testing.T) {
	for _, l := range luaLayouts() {
		seen := map[string]bool{"id": true, "width": true, "read": true, "pack": true}
		for _, n := range l.names {
			if seen[n] {
				t.Errorf("layout %s: field %q twice or reserved", l.id, n)
			}
			seen[n] = true
		}
	}
}
