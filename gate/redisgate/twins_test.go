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

// TestLuaTwinsExist: every "-- twin: pkg.F" or "-- twin: pkg.(*T).M" in
// the Lua names a function or method that exists in package gate or
// gate/inmem, the Go the Lua follows.
func TestLuaTwinsExist(t *testing.T) {
	have := map[string]bool{}
	for pkg, dir := range map[string]string{"gate": "..", "inmem": "../inmem"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := goparser.ParseFile(token.NewFileSet(), name, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok {
					continue
				}
				key := pkg + "." + fd.Name.Name
				if fd.Recv != nil && len(fd.Recv.List) == 1 {
					switch r := fd.Recv.List[0].Type.(type) {
					case *ast.StarExpr:
						key = pkg + ".(*" + r.X.(*ast.Ident).Name + ")." + fd.Name.Name
					case *ast.Ident:
						key = pkg + "." + r.Name + "." + fd.Name.Name
					}
				}
				have[key] = true
			}
		}
	}
	twin := regexp.MustCompile(`-- twin: (\S+)`)
	n := 0
	for _, name := range luaFiles {
		b, err := os.ReadFile(filepath.Join("lua", name))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range twin.FindAllStringSubmatch(string(b), -1) {
			n++
			if !have[m[1]] {
				t.Errorf("lua/%s: twin %s does not exist", name, m[1])
			}
		}
	}
	if n < 30 {
		t.Fatalf("%d twins found: the pattern no longer matches the comments", n)
	}
}
