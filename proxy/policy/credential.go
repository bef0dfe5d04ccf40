package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrRefresh: a credential refresh failed (the command failed or timed out,
// or the token file is missing, empty or malformed afterwards).
var ErrRefresh = errors.New("credential refresh failed")

// maxTokenSize bounds a token file.
const maxTokenSize = 64 << 10

// Refresher holds an upstream's bearer token and renews it after a 401.
// Safe for concurrent use: refreshes that overlap run the command once.
type Refresher struct {
	cred  Credential
	token atomic.Pointer[string]
	mu    sync.Mutex    // serialises refreshes
	gen   atomic.Uint64 // completed refreshes
}

func newRefresher(c Credential, token string) *Refresher {
	r := &Refresher{cred: c}
	r.token.Store(&token)
	return r
}

// Token is the current token ("" when none could be read yet).
func (r *Refresher) Token() string { return *r.token.Load() }

// Refresh renews the token: it runs the refresh command, if any, within
// its timeout (and ctx), then re-reads the token file. Callers that find a
// refresh already running wait for it and share its result instead of
// starting another. On failure the old token stays.
func (r *Refresher) Refresh(ctx context.Context) error {
	gen := r.gen.Load()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen.Load() != gen {
		return nil // another caller refreshed while this one waited
	}
	if len(r.cred.RefreshCommand) > 0 {
		if err := r.run(ctx); err != nil {
			return err
		}
	}
	tok, err := readToken(r.cred.BearerTokenFile)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRefresh, err)
	}
	r.token.Store(&tok)
	r.gen.Add(1)
	return nil
}

func (r *Refresher) run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, refreshTimeoutOrDefault(r.cred.RefreshTimeout))
	defer cancel()
	argv := r.cred.RefreshCommand
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = r.cred.Dir
	var out limitedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	killGroup(cmd)
	cmd.WaitDelay = time.Second // do not wait on pipes a stray child holds
	err := cmd.Run()
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %s: %w", ErrRefresh, argv[0], ctx.Err())
	}
	if err != nil {
		msg := strings.TrimSpace(out.String())
		if msg != "" {
			return fmt.Errorf("%w: %s: %w: %s", ErrRefresh, argv[0], err, msg)
		}
		return fmt.Errorf("%w: %s: %w", ErrRefresh, argv[0], err)
	}
	return nil
}

// Apply sets "Authorization: Bearer <token>" on req when a token is known.
func (r *Refresher) Apply(req *http.Request) {
	if t := r.Token(); t != "" {
		req.Header.Set("Authorization", "Bearer "+t)
	}
}

// authorize is Retry.Refresh: refresh, then rewrite the request's
// credentials.
func (r *Refresher) authorize(ctx context.Context, req *http.Request) error {
	if err := r.Refresh(ctx); err != nil {
		return err
	}
	if r.Token() == "" {
		return fmt.Errorf("%w: %s is empty", ErrRefresh, r.cred.BearerTokenFile)
	}
	r.Apply(req)
	return nil
}

// readToken reads a token file: surrounding white space dropped; it must be
// non-empty and fit in a header value.
func readToken(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf, err := io.ReadAll(io.LimitReader(f, maxTokenSize+1))
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if len(buf) > maxTokenSize {
		return "", fmt.Errorf("%s: token is larger than %d bytes", path, maxTokenSize)
	}
	tok := string(bytes.TrimSpace(buf))
	if tok == "" {
		return "", fmt.Errorf("%s: token file is empty", path)
	}
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("%s: token has a character not allowed in a header (byte %d)", path, i)
		}
	}
	return tok, nil
}

// limitedBuffer keeps the first 4 KiB a command prints, for error messages.
type limitedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := 4096 - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
