package sidecar

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/polygate/polygate/config"
)

// reloadDebounce is how long the configuration file must stay quiet after a
// change before it is read: an editor's save or a ConfigMap update is a
// burst of events, and a file read between them may be half written.
const reloadDebounce = 200 * time.Millisecond

// watchConfig tells changed, after reloadDebounce of quiet, each time the
// content of file differs from what it last read. It watches file's
// directory, not the file: editors replace a file by renaming over it, and
// Kubernetes updates a mounted ConfigMap by swapping the ..data symlink
// (dir/config.yaml → ..data/config.yaml, ..data → ..2026_xx), which no watch
// on the file itself would see. It returns once ctx ends; a watcher that
// cannot start is logged and SIGHUP still reloads.
func watchConfig(ctx context.Context, log *slog.Logger, file string, changed chan<- struct{}) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Warn("configuration file watch off; SIGHUP still reloads", "config", file, "err", err)
		return
	}
	defer w.Close()
	dir := filepath.Dir(file)
	if err := w.Add(dir); err != nil {
		log.Warn("configuration file watch off; SIGHUP still reloads", "config", file, "dir", dir, "err", err)
		return
	}
	last, _ := readConfig(file)
	quiet := time.NewTimer(0)
	<-quiet.C
	for {
		select {
		case <-ctx.Done():
			return
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			log.Warn("configuration file watch", "config", file, "err", err)
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			// Any change in the directory may be the file's: its name, the
			// ..data link it points through, or the target directory.
			if ev.Has(fsnotify.Chmod) && !ev.Has(fsnotify.Write) {
				continue
			}
			quiet.Reset(reloadDebounce)
		case <-quiet.C:
			now, err := readConfig(file)
			if err != nil || bytes.Equal(now, last) {
				// Gone for a moment (renamed over) or unchanged: a later
				// event brings the new content.
				continue
			}
			last = now
			select {
			case changed <- struct{}{}:
			default: // a reload is already due; it reads the newest file
			}
		}
	}
}

// readConfig is the file's content, at most config.MaxFileBytes + 1 bytes:
// enough to tell a change, and a larger file is refused by the reload it
// brings, not read whole at every change.
func readConfig(file string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, config.MaxFileBytes+1))
}
