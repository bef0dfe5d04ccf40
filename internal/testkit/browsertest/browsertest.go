// Package browsertest drives a real headless Chromium (Debian's
// `chromium`) over the DevTools protocol, for tests that look at a page
// as a person would: load it, wait for what appears, click, take a
// screenshot.
//
// A test that needs it calls Start: without chromium on PATH the test is
// skipped, or fails when CI asks for every prerequisite (testenv). The
// browser and its profile go when the test ends.
package browsertest

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
)

// Browser is a headless Chromium started for one test.
type Browser struct {
	cmd *exec.Cmd
	// http is the DevTools HTTP endpoint, http://127.0.0.1:PORT.
	http string
}

// devtoolsLine is what Chromium writes on stderr once it listens.
var devtoolsLine = regexp.MustCompile(`DevTools listening on ws://([^/\s]+)/`)

// Start starts Chromium (headless, its own profile in a temporary
// directory, DevTools on a loopback port it picks) and stops it when the
// test ends.
func Start(t testing.TB) *Browser {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	testenv.Require(t, err == nil, "chromium (Debian package chromium) on PATH")
	args := []string{
		"--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
		"--disable-dev-shm-usage", "--disable-extensions", "--disable-background-networking",
		"--disable-sync", "--mute-audio", "--hide-scrollbars", "--window-size=1400,1000",
		"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
		"--remote-allow-origins=*", "--user-data-dir=" + t.TempDir(),
	}
	if os.Geteuid() == 0 {
		args = append(args, "--no-sandbox") // Chromium refuses to run as root with it
	}
	cmd := exec.Command(bin, append(args, "about:blank")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	b := &Browser{cmd: cmd}
	t.Cleanup(func() {
		// The launcher script execs Chromium, whose helpers share its
		// process group: end them all.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	var tail []string
	var tailMu sync.Mutex
	go func() {
		sc := bufio.NewScanner(stderr)
		found := false
		for sc.Scan() {
			if m := devtoolsLine.FindStringSubmatch(sc.Text()); m != nil && !found {
				found = true
				addr <- m[1]
			}
			tailMu.Lock()
			tail = append(tail, sc.Text())
			if len(tail) > 20 {
				tail = tail[1:]
			}
			tailMu.Unlock()
		}
		close(addr)
	}()
	timer := time.NewTimer(60 * time.Second)
	defer timer.Stop()
	select {
	case a, ok := <-addr:
		if !ok {
			tailMu.Lock()
			defer tailMu.Unlock()
			t.Fatalf("chromium exited before listening:\n%s", strings.Join(tail, "\n"))
		}
		b.http = "http://" + a
	case <-timer.C:
		t.Fatal("chromium did not say where DevTools listens within 60 s")
	}
	return b
}

// Page is one tab, driven over its DevTools websocket.
type Page struct {
	t    testing.TB
	conn *websocket.Conn

	mu      sync.Mutex
	nextID  int
	pending map[int]chan message
	waiters map[string][]chan json.RawMessage
	// problems are the page's uncaught exceptions and console errors
	// (a resource the Content-Security-Policy blocked among them).
	problems []string
	closed   error
}

type message struct {
	ID     int             `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// NewPage opens a blank tab.
func (b *Browser) NewPage(t testing.TB) *Page {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, b.http+"/json/new?about:blank", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("new tab: %v", err)
	}
	defer resp.Body.Close()
	var target struct {
		WS string `json:"webSocketDebuggerUrl"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&target); err != nil || target.WS == "" {
		t.Fatalf("new tab: %v (status %s)", err, resp.Status)
	}
	conn, err := websocket.Dial(target.WS, "", b.http)
	if err != nil {
		t.Fatalf("devtools websocket: %v", err)
	}
	conn.MaxPayloadBytes = 64 << 20 // screenshots
	p := &Page{t: t, conn: conn, pending: map[int]chan message{}, waiters: map[string][]chan json.RawMessage{}}
	t.Cleanup(func() { conn.Close() })
	go p.read()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, m := range []string{"Page.enable", "Runtime.enable", "Log.enable"} {
		if err := p.Call(ctx, m, nil, nil); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
	}
	return p
}

// read dispatches what the browser sends: answers to their calls,
// events to their waiters.
func (p *Page) read() {
	for {
		var data []byte
		if err := websocket.Message.Receive(p.conn, &data); err != nil {
			p.mu.Lock()
			p.closed = err
			for id, ch := range p.pending {
				close(ch)
				delete(p.pending, id)
			}
			p.mu.Unlock()
			return
		}
		var m message
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		p.mu.Lock()
		if m.ID != 0 {
			if ch := p.pending[m.ID]; ch != nil {
				delete(p.pending, m.ID)
				ch <- m
			}
		} else {
			switch m.Method {
			case "Runtime.exceptionThrown":
				p.problems = append(p.problems, "exception: "+string(m.Params))
			case "Log.entryAdded":
				var e struct {
					Entry struct{ Level, Text, URL string }
				}
				if json.Unmarshal(m.Params, &e) == nil && e.Entry.Level == "error" {
					p.problems = append(p.problems, e.Entry.Text+" "+e.Entry.URL)
				}
			}
			for _, ch := range p.waiters[m.Method] {
				ch <- m.Params
			}
			delete(p.waiters, m.Method)
		}
		p.mu.Unlock()
	}
}

// Call sends a DevTools method and decodes its result into out (nil:
// ignored).
func (p *Page) Call(ctx context.Context, method string, params, out any) error {
	p.mu.Lock()
	if p.closed != nil {
		p.mu.Unlock()
		return fmt.Errorf("devtools connection closed: %w", p.closed)
	}
	p.nextID++
	id := p.nextID
	ch := make(chan message, 1)
	p.pending[id] = ch
	p.mu.Unlock()
	if params == nil {
		params = struct{}{}
	}
	req, err := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	if err != nil {
		return err
	}
	if err := websocket.Message.Send(p.conn, string(req)); err != nil {
		return err
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return errors.New("devtools connection closed")
		}
		if m.Error != nil {
			return fmt.Errorf("%s: %s (%d)", method, m.Error.Message, m.Error.Code)
		}
		if out != nil {
			return json.Unmarshal(m.Result, out)
		}
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		delete(p.pending, id)
		p.mu.Unlock()
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

// event returns a channel that gets the params of the next event method.
func (p *Page) event(method string) <-chan json.RawMessage {
	ch := make(chan json.RawMessage, 1)
	p.mu.Lock()
	p.waiters[method] = append(p.waiters[method], ch)
	p.mu.Unlock()
	return ch
}

// Navigate loads url and waits for its load event.
func (p *Page) Navigate(ctx context.Context, url string) error {
	loaded := p.event("Page.loadEventFired")
	var res struct {
		ErrorText string `json:"errorText"`
	}
	if err := p.Call(ctx, "Page.navigate", map[string]any{"url": url}, &res); err != nil {
		return err
	}
	if res.ErrorText != "" {
		return fmt.Errorf("navigate %s: %s", url, res.ErrorText)
	}
	select {
	case <-loaded:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("navigate %s: no load event: %w", url, ctx.Err())
	}
}

// Eval evaluates a JavaScript expression in the page (a promise is
// awaited) and decodes its value into out (nil: ignored).
func (p *Page) Eval(ctx context.Context, expr string, out any) error {
	var res struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	err := p.Call(ctx, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &res)
	if err != nil {
		return err
	}
	if res.Exception != nil {
		return fmt.Errorf("javascript: %s %s", res.Exception.Text, res.Exception.Exception.Description)
	}
	if out != nil && len(res.Result.Value) > 0 {
		return json.Unmarshal(res.Result.Value, out)
	}
	return nil
}

// WaitFor waits until the JavaScript expression cond (re-evaluated at
// each change of the page's DOM) is truthy, and decodes its value into
// out. It waits on the page's own mutation events, not on a clock; ctx
// bounds it.
func (p *Page) WaitFor(ctx context.Context, cond string, out any) error {
	expr := `new Promise(resolve => {
  const check = () => { try { return (` + cond + `); } catch (e) { return null; } };
  const v = check();
  if (v) { resolve(v); return; }
  const obs = new MutationObserver(() => {
    const v = check();
    if (v) { obs.disconnect(); resolve(v); }
  });
  obs.observe(document, {subtree: true, childList: true, characterData: true, attributes: true});
})`
	err := p.Eval(ctx, expr, out)
	if err != nil {
		return fmt.Errorf("waiting for %s: %w", cond, err)
	}
	return nil
}

// Click clicks the centre of the first element matching a CSS selector
// with the mouse, as a person would.
func (p *Page) Click(ctx context.Context, selector string) error {
	var at struct{ X, Y float64 }
	q, _ := json.Marshal(selector)
	if err := p.Eval(ctx, `(() => { const e = document.querySelector(`+string(q)+`); if (!e) throw new Error("no element "+`+string(q)+`);
  e.scrollIntoView({block: "center"}); const r = e.getBoundingClientRect(); return {X: r.x + r.width/2, Y: r.y + r.height/2}; })()`, &at); err != nil {
		return err
	}
	for _, typ := range []string{"mouseMoved", "mousePressed", "mouseReleased"} {
		ev := map[string]any{"type": typ, "x": at.X, "y": at.Y, "button": "left", "clickCount": 1}
		if typ == "mouseMoved" {
			ev["button"] = "none"
		}
		if err := p.Call(ctx, "Input.dispatchMouseEvent", ev, nil); err != nil {
			return err
		}
	}
	return nil
}

// ClickToLoad clicks like Click an element that loads another page (a
// link) and waits for that page's load event.
func (p *Page) ClickToLoad(ctx context.Context, selector string) error {
	loaded := p.event("Page.loadEventFired")
	if err := p.Click(ctx, selector); err != nil {
		return err
	}
	select {
	case <-loaded:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("click %s: no page loaded: %w", selector, ctx.Err())
	}
}

// Screenshot is a PNG of what the page shows now.
func (p *Page) Screenshot(ctx context.Context) ([]byte, error) {
	var res struct {
		Data string `json:"data"`
	}
	if err := p.Call(ctx, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true}, &res); err != nil {
		return nil, err
	}
	return base64.StdEncoding.DecodeString(res.Data)
}

// Problems are the page's uncaught exceptions and console errors so far
// (resources the Content-Security-Policy refused included).
func (p *Page) Problems() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.problems...)
}

// ScreenshotOnFailure saves a screenshot of p when the test has failed
// by its end, in $EGRET_ARTIFACTS or else a directory of its own under
// the system's temporary directory (kept: t.TempDir would be removed with
// the test), and logs its path.
func ScreenshotOnFailure(t testing.TB, p *Page) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		png, err := p.Screenshot(ctx)
		if err != nil {
			t.Logf("no screenshot: %v", err)
			return
		}
		dir := os.Getenv("EGRET_ARTIFACTS")
		if dir == "" {
			dir, err = os.MkdirTemp("", "egret-artifact-")
		} else {
			err = os.MkdirAll(dir, 0o755)
		}
		if err != nil {
			t.Logf("no screenshot: %v", err)
			return
		}
		name := filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+".png")
		if err := os.WriteFile(name, png, 0o644); err != nil {
			t.Logf("no screenshot: %v", err)
			return
		}
		t.Logf("screenshot of the page at the failure: %s", name)
	})
}

// Text is the text a person sees in the elements matching a CSS selector,
// one string per element (innerText: hidden text left out).
func (p *Page) Text(ctx context.Context, selector string) ([]string, error) {
	q, _ := json.Marshal(selector)
	var out []string
	err := p.Eval(ctx, `Array.from(document.querySelectorAll(`+string(q)+`), e => e.innerText)`, &out)
	return out, err
}
