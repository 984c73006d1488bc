package boundedfile

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
)

// Read returns the content of the file at path, or an error when it holds
// more than limit bytes; at most limit+1 bytes are read. Its errors do not
// repeat the path: the caller names the key or flag that gave it.
func Read(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, pathless(err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, pathless(err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("longer than %d bytes", limit)
	}
	return b, nil
}

// pathless is err without the *fs.PathError around it ("open /x: no such
// file or directory" becomes "no such file or directory").
func pathless(err error) error {
	if inner := errors.Unwrap(err); inner != nil {
		return inner
	}
	return err
}

// MaxCABytes bounds a CA bundle: far above any real one.
const MaxCABytes = 1 << 20

// CertPool is the PEM certificates of the file at path (at most MaxCABytes),
// as a pool of roots; a file with none is an error.
func CertPool(path string) (*x509.CertPool, error) {
	pem, err := Read(path, MaxCABytes)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("no PEM certificate in it")
	}
	return pool, nil
}
