package boundedfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/polygate/polygate/internal/testcerts"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name    string
		path    string
		want    string
		wantErr string
	}{
		{"at the limit", write("four", "abcd"), "abcd", ""},
		{"one byte over", write("five", "abcde"), "", "longer than 4 bytes"},
		{"missing, without its path", filepath.Join(dir, "gone"), "", "no such file or directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Read(tc.path, 4)
			switch {
			case tc.wantErr == "" && (err != nil || string(b) != tc.want):
				t.Fatalf("Read = %q, %v; want %q", b, err, tc.want)
			case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
				t.Fatalf("Read error = %v; want %q", err, tc.wantErr)
			case err != nil && strings.Contains(err.Error(), dir):
				t.Fatalf("Read error %q repeats the path", err)
			}
		})
	}
}

func TestCertPool(t *testing.T) {
	ca := testcerts.NewCA(t)
	if pool, err := CertPool(ca.File); err != nil || pool == nil {
		t.Fatalf("CertPool(a CA file) = %v, %v", pool, err)
	}
	key := ca.Issue("x").KeyFile
	if _, err := CertPool(key); err == nil || err.Error() != "no PEM certificate in it" {
		t.Fatalf("CertPool(a key file) error = %v, want no PEM certificate", err)
	}
}
