package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is a server the bench started: the sidecar or the floor. Its
// stderr goes to a file (a sidecar logs one line per waiting call).
type process struct {
	name string
	cmd  *exec.Cmd
	addr string
	log  string // path of its stderr
	done chan error
	// metrics receives the address of its /metrics, when it prints one
	// ("... metrics on URL", after the listening line).
	metrics chan string
}

// startProcess runs argv with extra environment and waits until it prints
// "... listening on ADDR" on stdout.
func startProcess(name string, argv, env []string, logPath string) (*process, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, argv[0], err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan error, 1), metrics: make(chan string, 1)}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if _, a, ok := strings.Cut(sc.Text(), "listening on "); ok {
				select {
				case addr <- a:
				default:
				}
			}
			if _, u, ok := strings.Cut(sc.Text(), "metrics on "); ok {
				select {
				case p.metrics <- u:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() { p.done <- cmd.Wait() }()
	select {
	case p.addr = <-addr:
		return p, nil
	case err := <-p.done:
		return nil, fmt.Errorf("%s exited before listening: %v (log: %s)", name, err, logPath)
	case <-time.After(30 * time.Second):
		p.stop()
		return nil, fmt.Errorf("%s did not say where it listens within 30s (log: %s)", name, logPath)
	}
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// metricsURL is the URL of the process's /metrics ("" when it printed none
// within a few seconds of listening).
func (p *process) metricsURL() string {
	select {
	case u := <-p.metrics:
		p.metrics <- u
		return u
	case <-time.After(5 * time.Second):
		return ""
	}
}

// stop asks the process to end (SIGTERM) and kills it after 10 s.
func (p *process) stop() {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		_ = p.cmd.Process.Kill()
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
