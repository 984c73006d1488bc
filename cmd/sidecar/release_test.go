package main

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// runMake runs the repository's Makefile with args and returns its stdout.
func runMake(t *testing.T, ctx context.Context, env []string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	cmd := exec.CommandContext(ctx, "make", append([]string{"-s", "-C", "../.."}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// TestReleaseBinariesNameTheirVersion runs `make release` for this
// machine's platform with GOFLAGS=-buildvcs=false (so nothing comes from
// the go command's VCS stamping): the archive's checksum is in SHA256SUMS,
// it holds both binaries, LICENSE and README.md, the binaries are static,
// and each --version names the version and revision given.
func TestReleaseBinariesNameTheirVersion(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("make release builds linux binaries; this test runs them")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute) // a cold build cache compiles everything
	defer cancel()
	dist := t.TempDir()
	const version, revision = "v1.2.3-rc.1", "0123456789abcdef0123456789abcdef01234567"
	runMake(t, ctx, []string{"GOFLAGS=-buildvcs=false"}, "release", "DIST="+dist, "PLATFORMS=linux/"+runtime.GOARCH,
		"VERSION="+version, "REVISION="+revision)

	name := "polygate_" + version + "_linux_" + runtime.GOARCH
	archive := filepath.Join(dist, name+".tar.gz")
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	if want := sha256File(t, archive) + "  " + name + ".tar.gz\n"; string(sums) != want {
		t.Errorf("SHA256SUMS:\n%s\nwant:\n%s", sums, want)
	}
	dir := t.TempDir()
	got := untar(t, archive, dir)
	for _, f := range []string{"polygate", "polygatectl", "LICENSE", "README.md"} {
		if !got[name+"/"+f] {
			t.Errorf("the archive lacks %s/%s (has %v)", name, f, got)
		}
	}
	for _, bin := range []string{"polygate", "polygatectl"} {
		path := filepath.Join(dir, name, bin)
		if dynamic(t, path) {
			t.Errorf("%s is dynamically linked; a release binary runs on a distroless static image", bin)
		}
		cmd := exec.CommandContext(ctx, path, "--version")
		cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s --version: %v", bin, err)
		}
		if want := bin + " " + version + " revision " + revision + " go"; !strings.HasPrefix(string(out), want) {
			t.Errorf("%s --version printed %q, want it to start with %q", bin, out, want)
		}
	}
}

// TestMakeStampsTheGitTagAndCommit: without VERSION and REVISION, builds
// stamp `git describe --tags --always --dirty` (the tag, on a tagged
// commit) and the commit.
func TestMakeStampsTheGitTagAndCommit(t *testing.T) {
	ctx := testContext(t)
	git := func(args ...string) string {
		out, err := exec.CommandContext(ctx, "git", append([]string{"-C", "../.."}, args...)...).Output()
		if err != nil {
			t.Skipf("git %v: %v (not a git work tree?)", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	want := git("describe", "--tags", "--always", "--dirty") + " " + git("rev-parse", "HEAD")
	if got := strings.TrimSpace(runMake(t, ctx, nil, "version")); got != want {
		t.Errorf("make version: %q, want %q", got, want)
	}
}

// TestDockerfileBuildsAsMakeDoes: the image's binaries come from make
// build, with the stamps from the build arguments.
func TestDockerfileBuildsAsMakeDoes(t *testing.T) {
	text, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(text), `make build DIST=/out VERSION="${VERSION}" REVISION="${REVISION}"`) {
		t.Error("the Dockerfile does not build with make build and the VERSION and REVISION build arguments")
	}
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// untar extracts the regular files of a .tar.gz into dir and returns their
// names.
func untar(t *testing.T, archive, dir string) map[string]bool {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(bufio.NewReader(f))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	names := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if !filepath.IsLocal(h.Name) {
			t.Fatalf("the archive has %q, outside its directory", h.Name)
		}
		names[h.Name] = true
		path := filepath.Join(dir, h.Name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o755)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, tr); err != nil {
			t.Fatal(err)
		}
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// dynamic says whether the ELF file at path asks for a dynamic loader.
func dynamic(t *testing.T, path string) bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}
