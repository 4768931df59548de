package controller

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/api"
)

// serveAPI serves c's operator API on loopback, as `edgehop controller`
// does, with a token made in a fresh state directory.
func serveAPI(t testing.TB, c *Controller) (*httptest.Server, string) {
	t.Helper()
	tok, err := LoadOrCreateToken(filepath.Join(t.TempDir(), TokenFileName))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = c.Handler(Auth{Token: tok, Hosts: LoopbackHosts(srv.Listener.Addr().String())})
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, tok
}

// noRedirect does not follow redirects, so that /login's can be checked.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// do sends a request with Content-Type ctype and Authorization authz
// when not empty, and the header pairs in extra ("Host" sets the Host).
func do(t testing.TB, method, u, ctype, body, authz string, extra ...string) *http.Response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i] == "Host" {
			req.Host = extra[i+1]
		} else {
			req.Header.Set(extra[i], extra[i+1])
		}
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// wantStatus checks a response's status and, for an error, that it is
// the API's JSON error.
func wantStatus(t *testing.T, what string, resp *http.Response, status int) api.Error {
	t.Helper()
	var e api.Error
	if resp.StatusCode != status {
		b, _ := io.ReadAll(resp.Body)
		t.Errorf("%s: %s, want %d: %s", what, resp.Status, status, b)
		return e
	}
	if status >= 400 {
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Message == "" {
			t.Errorf("%s: not the API's JSON error: %+v %v", what, e, err)
		}
	}
	return e
}

const userJSON = `{"name":"bob","pos":{"x":10,"y":0}}`

func TestAPIRefusesUnauthenticated(t *testing.T) {
	c, _ := newTestController(t, ":memory:")
	srv, tok := serveAPI(t, c)
	for _, tc := range []struct {
		what, method, path, body, authz string
	}{
		{"GET without a token", "GET", "/v1/nodes", "", ""},
		{"the dashboard without a token", "GET", "/", "", ""},
		{"openapi.json without a token", "GET", "/openapi.json", "", ""},
		{"the event stream without a token", "GET", "/v1/stream", "", ""},
		{"POST without a token", "POST", "/v1/users", userJSON, ""},
		{"a wrong token", "POST", "/v1/users", userJSON, "Bearer " + strings.Repeat("0", len(tok))},
		{"a prefix of the token", "GET", "/v1/nodes", "", "Bearer " + tok[:len(tok)-1]},
		{"the token with another scheme", "GET", "/v1/nodes", "", "Basic " + tok},
		{"an empty bearer", "GET", "/v1/nodes", "", "Bearer "},
	} {
		resp := do(t, tc.method, srv.URL+tc.path, "application/json", tc.body, tc.authz)
		e := wantStatus(t, tc.what, resp, http.StatusUnauthorized)
		if e.Code != "unauthenticated" || !strings.Contains(e.Message, "edgehop testbed status") || !strings.Contains(e.Message, "Bearer") {
			t.Errorf("%s: the error does not say how to authenticate: %+v", tc.what, e)
		}
		if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: WWW-Authenticate %q", tc.what, resp.Header.Get("WWW-Authenticate"))
		}
	}
	if _, ok := c.eng.User("bob"); ok {
		t.Fatal("an unauthenticated POST added a user")
	}
	wantStatus(t, "GET with the token", do(t, "GET", srv.URL+"/v1/nodes", "", "", "Bearer "+tok), http.StatusOK)
	wantStatus(t, "POST with the token", do(t, "POST", srv.URL+"/v1/users", "application/json", userJSON, "bearer "+tok), http.StatusCreated)
	wantStatus(t, "the dashboard with the token", do(t, "GET", srv.URL+"/", "", "", "Bearer "+tok), http.StatusOK)

	// Auth without a token refuses everything.
	open := httptest.NewUnstartedServer(nil)
	open.Config.Handler = c.Handler(Auth{Hosts: LoopbackHosts(open.Listener.Addr().String())})
	open.Start()
	defer open.Close()
	wantStatus(t, "no token configured", do(t, "GET", open.URL+"/v1/nodes", "", "", "Bearer "), http.StatusUnauthorized)
}

func TestClientSendsToken(t *testing.T) {
	c, _ := newTestController(t, ":memory:")
	srv, tok := serveAPI(t, c)
	ctx := context.Background()
	if _, err := NewClient(srv.URL, tok).AddUser(ctx, AddUserRequest{Name: "bob"}); err != nil {
		t.Fatal(err)
	}
	_, err := NewClient(srv.URL, "").Nodes(ctx)
	var e *api.Error
	if !errors.As(err, &e) || e.Code != "unauthenticated" || !strings.Contains(e.Message, "token") {
		t.Fatalf("a client without the token: %v", err)
	}
}

func TestLoginCookie(t *testing.T) {
	c, _ := newTestController(t, ":memory:")
	srv, tok := serveAPI(t, c)
	resp := do(t, "GET", srv.URL+"/login?token=wrong", "", "", "")
	wantStatus(t, "login with a wrong token", resp, http.StatusUnauthorized)
	if len(resp.Cookies()) != 0 {
		t.Errorf("a wrong token set cookies: %v", resp.Cookies())
	}
	resp = do(t, "GET", LoginURL(srv.URL, tok)+"&nostream", "", "", "")
	wantStatus(t, "login", resp, http.StatusSeeOther)
	if loc := resp.Header.Get("Location"); loc != "/?nostream" {
		t.Errorf("login redirects to %q, want /?nostream (the token dropped)", loc)
	}
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	var ck *http.Cookie
	for _, k := range resp.Cookies() {
		if k.Name == "edgehop_token_"+port {
			ck = k
		}
	}
	if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" {
		t.Fatalf("login cookie %+v, want edgehop_token_%s, HttpOnly, SameSite=Strict, Path=/", ck, port)
	}
	cookie := ck.Name + "=" + ck.Value
	same := "http://" + srv.Listener.Addr().String()
	wantStatus(t, "GET with the cookie", do(t, "GET", srv.URL+"/v1/nodes", "", "", "", "Cookie", cookie), http.StatusOK)
	wantStatus(t, "the dashboard with the cookie", do(t, "GET", srv.URL+"/", "", "", "", "Cookie", cookie), http.StatusOK)
	wantStatus(t, "a same-origin POST with the cookie", do(t, "POST", srv.URL+"/v1/users", "application/json", userJSON, "",
		"Cookie", cookie, "Origin", same, "Sec-Fetch-Site", "same-origin"), http.StatusCreated)
	wantStatus(t, "another port's cookie", do(t, "GET", srv.URL+"/v1/nodes", "", "", "", "Cookie", "edgehop_token_1="+ck.Value), http.StatusUnauthorized)
	wantStatus(t, "a wrong cookie", do(t, "GET", srv.URL+"/v1/nodes", "", "", "", "Cookie", ck.Name+"=x"+ck.Value[1:]), http.StatusUnauthorized)
	for _, tc := range []struct{ what, k, v string }{
		{"a cross-origin POST", "Origin", "http://evil.example"},
		{"a POST from an opaque origin", "Origin", "null"},
		{"a POST from another port", "Origin", "http://127.0.0.1:1"},
		{"a POST from a cross-site page", "Sec-Fetch-Site", "cross-site"},
	} {
		e := wantStatus(t, tc.what, do(t, "POST", srv.URL+"/v1/users", "application/json", `{"name":"eve","pos":{"x":1}}`, "",
			"Cookie", cookie, tc.k, tc.v), http.StatusForbidden)
		if e.Code != "forbidden" {
			t.Errorf("%s: %+v", tc.what, e)
		}
	}
	wantStatus(t, "a cross-origin GET", do(t, "GET", srv.URL+"/v1/users", "", "", "", "Cookie", cookie, "Origin", "http://evil.example"), http.StatusForbidden)
	if _, ok := c.eng.User("eve"); ok {
		t.Fatal("a cross-origin POST added a user")
	}
}

func TestHostCheck(t *testing.T) {
	c, _ := newTestController(t, ":memory:")
	srv, tok := serveAPI(t, c)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	for _, h := range []string{"evil.example:" + port, "evil.example", "127.0.0.1:1", "localhost", "127.0.0.1.evil.example:" + port} {
		e := wantStatus(t, "Host "+h, do(t, "GET", srv.URL+"/v1/nodes", "", "", "Bearer "+tok, "Host", h), http.StatusMisdirectedRequest)
		if e.Code != "misdirected" {
			t.Errorf("Host %s: %+v", h, e)
		}
		wantStatus(t, "login at Host "+h, do(t, "GET", LoginURL(srv.URL, tok), "", "", "", "Host", h), http.StatusMisdirectedRequest)
	}
	for _, h := range []string{"localhost:" + port, "LOCALHOST:" + port, "127.0.0.1:" + port, "[::1]:" + port} {
		wantStatus(t, "Host "+h, do(t, "GET", srv.URL+"/v1/nodes", "", "", "Bearer "+tok, "Host", h), http.StatusOK)
	}
	if got := LoopbackHosts("0.0.0.0:7000", "edge.example:443"); strings.Join(got, " ") != "0.0.0.0:7000 localhost:7000 127.0.0.1:7000 [::1]:7000 edge.example:443" {
		t.Errorf("LoopbackHosts: %v", got)
	}
}

func TestContentType(t *testing.T) {
	c, _ := newTestController(t, ":memory:")
	srv, tok := serveAPI(t, c)
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "application/jsonx"} {
		e := wantStatus(t, "POST as "+ct, do(t, "POST", srv.URL+"/v1/users", ct, userJSON, "Bearer "+tok), http.StatusUnsupportedMediaType)
		if e.Code != "unsupported_media_type" {
			t.Errorf("POST as %q: %+v", ct, e)
		}
	}
	wantStatus(t, "POST as JSON with a charset", do(t, "POST", srv.URL+"/v1/users", "application/json; charset=utf-8", userJSON, "Bearer "+tok), http.StatusCreated)
}

func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, TokenFileName)
	tok, err := LoadOrCreateToken(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(tok) != 64 || checkToken(tok) != nil {
		t.Errorf("token %q: want 32 random bytes in hex", tok)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v, want mode 0600", fi.Mode(), err)
	}
	again, err := LoadOrCreateToken(path)
	if err != nil || again != tok {
		t.Fatalf("a restarted controller's token %q %v, want the first one", again, err)
	}
	if got, err := ReadToken(path); err != nil || got != tok {
		t.Fatalf("ReadToken: %q %v", got, err)
	}
	other, err := LoadOrCreateToken(filepath.Join(dir, "other"))
	if err != nil || other == tok {
		t.Fatalf("a second controller's token %q %v: want another", other, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateToken(path); err == nil {
		t.Error("a token file others may read was used")
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateToken(short); err == nil {
		t.Error("a 6-character token was used")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 3 {
		t.Errorf("left in the state directory: %v", entries)
	}
	fc := FileConfig{DB: "/var/lib/edgehop/controller.db"}
	if got := fc.TokenPath(); got != "/var/lib/edgehop/"+TokenFileName {
		t.Errorf("default token file %q: want it beside the DB", got)
	}
	fc.TokenFile = "/etc/edgehop/token"
	if got := fc.TokenPath(); got != fc.TokenFile {
		t.Errorf("configured token file %q", got)
	}
}

// The event stream outlives the servers' read and write timeouts.
func TestStreamOutlivesTimeouts(t *testing.T) {
	s := NewServer(http.NotFoundHandler(), nil)
	if s.ReadHeaderTimeout == 0 || s.ReadTimeout == 0 || s.WriteTimeout == 0 || s.IdleTimeout == 0 {
		t.Fatalf("server timeouts %+v", s)
	}
	defer func(p time.Duration) { streamPing = p }(streamPing)
	streamPing = 20 * time.Millisecond
	c, _ := newTestController(t, ":memory:")
	tok, err := LoadOrCreateToken(filepath.Join(t.TempDir(), TokenFileName))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: c.Handler(Auth{Token: tok, Hosts: LoopbackHosts(l.Addr().String())}),
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond}
	go srv.Serve(l)
	defer srv.Close()
	resp := do(t, "GET", (&url.URL{Scheme: "http", Host: l.Addr().String(), Path: "/v1/stream"}).String(), "", "", "Bearer "+tok)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	start, pings := time.Now(), 0
	for time.Since(start) < 400*time.Millisecond && sc.Scan() {
		if sc.Text() == ": ping" {
			pings++
		}
	}
	if elapsed := time.Since(start); elapsed < 400*time.Millisecond || pings < 5 {
		t.Fatalf("the stream ended after %v, %d pings (%v): the timeouts cut it", elapsed, pings, sc.Err())
	}
}

// FuzzGuard: whatever a request's headers, the guard does not panic and
// lets through only requests at an allowed host carrying the token.
func FuzzGuard(f *testing.F) {
	const tok = "0123456789abcdef0123456789abcdef"
	const host = "127.0.0.1:7000"
	for _, s := range [][6]string{
		{"GET", "/v1/nodes", "", host, "", "Bearer " + tok},
		{"POST", "/v1/users", "", host, "http://" + host, "Bearer " + tok},
		{"GET", "/login", "token=" + tok + "&nostream", "localhost:7000", "", ""},
		{"POST", "/v1/users", "", "evil.example:7000", "null", "Bearer " + tok},
		{"PUT", "/", "", "[::1]:7000", "http://[::1]:7000", "bearer  " + tok + " "},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5], "application/json", "edgehop_token_7000="+tok)
	}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	g := Auth{Token: tok, Hosts: LoopbackHosts(host)}.wrap(next)
	f.Fuzz(func(t *testing.T, method, path, query, host, origin, authz, ctype, cookie string) {
		r := &http.Request{Method: method, URL: &url.URL{Path: path, RawQuery: query}, Host: host, Header: http.Header{},
			Body: http.NoBody, ContentLength: 1}
		r.Header.Set("Origin", origin)
		r.Header.Set("Authorization", authz)
		r.Header.Set("Content-Type", ctype)
		r.Header.Set("Cookie", cookie)
		w := httptest.NewRecorder()
		g.ServeHTTP(w, r)
		if w.Code != http.StatusTeapot && w.Code != http.StatusSeeOther {
			return
		}
		if !g.hosts[strings.ToLower(host)] {
			t.Fatalf("host %q let through", host)
		}
		if !strings.Contains(authz, tok) && !strings.Contains(cookie, tok) && r.URL.Query().Get("token") != tok {
			t.Fatalf("let through without the token: %q %q %q", authz, cookie, query)
		}
	})
}
